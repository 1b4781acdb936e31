// SPDX-License-Identifier: Apache-2.0
//! `pvrdma-vmm`: parse the command line, boot the VM, exit with a code
//! that says how it ended (see `--help`).
#![deny(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use vmm::cli::{Cli, Mode};
use vmm::outcome::{EXIT_ERROR, EXIT_OK, EXIT_USAGE};
use vmm::vmm::Vmm;

fn main() {
    let cli = Cli::parse();
    vmm::logging::init(cli.log_level);
    vmm::raise_fd_limit();
    let mode = match cli.mode() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(EXIT_USAGE);
        }
    };
    if let Err(e) = vmm::sandbox::init(cli.seccomp) {
        eprintln!("error: {e}");
        std::process::exit(EXIT_USAGE);
    }
    device_worker::set_thread_start(|| vmm::sandbox::enter(vmm::sandbox::Kind::Device));
    let api = cli.api_socket.as_deref();
    let vmm = match mode {
        Mode::Boot(config) => Vmm::boot(*config, api).map(Some),
        Mode::Restore(dir) => Vmm::restore(&dir, cli.serial.clone(), api).map(Some),
        // `Mode::Receive` is only chosen with an API socket.
        Mode::Receive => match api {
            Some(path) => Vmm::receive(path, &cli.serial),
            None => Ok(None),
        },
    };
    let code = match vmm {
        Ok(Some(vmm)) => match vmm.run() {
            Ok(outcome) => outcome.exit_code(),
            Err(e) => {
                eprintln!("pvrdma-vmm: {}", vmm::error_chain(&e));
                EXIT_ERROR
            }
        },
        Ok(None) => EXIT_OK,
        Err(e) => {
            eprintln!("pvrdma-vmm: {}", vmm::error_chain(&e));
            EXIT_USAGE
        }
    };
    std::process::exit(code);
}
