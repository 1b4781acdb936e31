// SPDX-License-Identifier: Apache-2.0
//! `pvrdma-vmm`: parse the command line, boot the VM, exit with a code
//! that says how it ended (see `--help`).

use clap::Parser;
use vmm::cli::Cli;
use vmm::vmm::{Vmm, EXIT_ERROR, EXIT_USAGE};

fn main() {
    let cli = Cli::parse();
    env_logger::Builder::new()
        .filter_level(cli.log_level)
        .format_target(false)
        .init();
    vmm::raise_fd_limit();
    let config = match cli.vm_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(EXIT_USAGE);
        }
    };
    let code = match Vmm::boot(config, cli.api_socket.as_deref()) {
        Ok(vmm) => match vmm.run() {
            Ok(outcome) => outcome.exit_code(),
            Err(e) => {
                eprintln!("pvrdma-vmm: {}", vmm::error_chain(&e));
                EXIT_ERROR
            }
        },
        Err(e) => {
            eprintln!("pvrdma-vmm: {}", vmm::error_chain(&e));
            EXIT_USAGE
        }
    };
    std::process::exit(code);
}
