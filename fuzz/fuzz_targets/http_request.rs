// SPDX-License-Identifier: Apache-2.0
//! The API server's HTTP/1.1 request reader and router (`api::fuzz_request`: the code the
//! server thread runs on a connection, over an in-memory stream), error response included.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match api::fuzz_request(data) {
        Ok(request) => {
            // Only a complete, routable request reaches the VMM.
            let route = request.route();
            assert!(api::ROUTES
                .iter()
                .any(|r| r.path == route.path && r.method == route.method));
        }
        Err(status) => assert!((400..=505).contains(&status), "status {status}"),
    }
});
