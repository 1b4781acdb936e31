// SPDX-License-Identifier: Apache-2.0

//! The API server over a real Unix socket, against a fake VMM.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use api::client::ClientError;
use api::{
    ApiError, ApiRequest, ReceiveMigrationParams, SendMigrationParams, ServerOptions,
    SnapshotParams, VmCounters, VmInfo, VmState, VmmPing, MAX_BODY_BYTES,
};
use common::{raw_exchange, status_of, test_config, test_counters, Behaviour, Harness};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempdir::TempDir;

fn expect_http(result: Result<Option<serde_json::Value>, ClientError>) -> (u16, String) {
    match result {
        Err(ClientError::Http { status, message }) => (status, message),
        other => panic!("expected an HTTP error, got {other:?}"),
    }
}

fn info(h: &Harness) -> VmInfo {
    let body = h
        .client
        .call(&ApiRequest::VmInfo)
        .unwrap()
        .expect("info body");
    serde_json::from_value(body).unwrap()
}

#[test]
fn every_endpoint_round_trips() {
    let h = Harness::start();

    let ping: VmmPing =
        serde_json::from_value(h.client.call(&ApiRequest::Ping).unwrap().unwrap()).unwrap();
    assert_eq!(ping.pid, std::process::id());
    assert_eq!(ping.features, ["test"]);

    let vm = info(&h);
    assert_eq!(vm.state, VmState::Running);
    assert_eq!(vm.config, Some(test_config()));
    assert_eq!(vm.migration, None);
    assert_eq!(vm.uptime_ms, 42);

    let counters: VmCounters =
        serde_json::from_value(h.client.call(&ApiRequest::Counters).unwrap().unwrap()).unwrap();
    assert_eq!(counters, test_counters(None));

    assert_eq!(h.client.call(&ApiRequest::Pause).unwrap(), None);
    assert_eq!(info(&h).state, VmState::Paused);
    assert_eq!(h.client.call(&ApiRequest::Resume).unwrap(), None);
    assert_eq!(info(&h).state, VmState::Running);
    assert_eq!(h.client.call(&ApiRequest::Shutdown).unwrap(), None);
    assert_eq!(info(&h).state, VmState::Shutdown);

    use ApiRequest as R;
    assert_eq!(
        h.stop(),
        [
            R::Ping,
            R::VmInfo,
            R::Counters,
            R::Pause,
            R::VmInfo,
            R::Resume,
            R::VmInfo,
            R::Shutdown,
            R::VmInfo
        ],
        "the VMM sees each request once, in order"
    );
}

#[test]
fn invalid_state_is_409_with_the_vmm_message() {
    let h = Harness::start();
    let (status, message) = expect_http(h.client.call(&ApiRequest::Resume));
    assert_eq!((status, message.as_str()), (409, "VM is not paused"));
    h.client.call(&ApiRequest::Pause).unwrap();
    let (status, message) = expect_http(h.client.call(&ApiRequest::Pause));
    assert_eq!((status, message.as_str()), (409, "VM is already paused"));
    h.assert_alive();
}

#[test]
fn unknown_path_is_404() {
    let h = Harness::start();
    for path in ["/api/v1/vm.reboot", "/api/v2/vm.info", "/"] {
        let r = h.client.send_raw("GET", path, None).unwrap();
        assert_eq!(r.status, 404, "{path}");
        let (_, message) = expect_http(r.into_json());
        assert_eq!(message, format!("Unknown endpoint {path}"));
    }
    h.assert_alive();
}

#[test]
fn wrong_method_is_405_with_allow() {
    let h = Harness::start();
    let r = h.client.send_raw("GET", "/api/v1/vm.pause", None).unwrap();
    assert_eq!((r.status, r.allow.as_deref()), (405, Some("PUT")));
    let r = h
        .client
        .send_raw("DELETE", "/api/v1/vm.info", None)
        .unwrap();
    assert_eq!((r.status, r.allow.as_deref()), (405, Some("GET")));
    let (_, message) = expect_http(r.into_json());
    assert!(message.contains("DELETE"), "{message}");
    assert_eq!(info(&h).state, VmState::Running, "nothing reached the VMM");
}

#[test]
fn bad_bodies_are_400() {
    let h = Harness::start();
    for body in [&b"{"[..], b"{\"force\": true}", b"null", b"\x00\x01"] {
        let r = h
            .client
            .send_raw("PUT", "/api/v1/vm.pause", Some(body))
            .unwrap();
        assert_eq!(r.status, 400, "{body:?}");
    }
    let r = h
        .client
        .send_raw("PUT", "/api/v1/vm.pause", Some(b"{\"force\": 1}"))
        .unwrap();
    let (_, message) = expect_http(r.into_json());
    assert!(
        message.starts_with("Invalid request body: unknown field `force`"),
        "{message}"
    );
    let r = h
        .client
        .send_raw("GET", "/api/v1/vm.info", Some(b"{}"))
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        info(&h).state,
        VmState::Running,
        "no bad request reached the VMM"
    );
    // `{}` is the one body an action without parameters takes.
    let r = h
        .client
        .send_raw("PUT", "/api/v1/vm.pause", Some(b"{}"))
        .unwrap();
    assert_eq!(r.status, 204);
}

#[test]
fn action_params_reach_the_vmm_intact() {
    let h = Harness::start();
    let send = ApiRequest::SendMigration(SendMigrationParams {
        downtime_ms: 20,
        timeout_s: 90,
        ..SendMigrationParams::new("tcp:10.0.0.2:6000")
    });
    let receive = ApiRequest::ReceiveMigration(ReceiveMigrationParams {
        taps: [("52:54:00:00:00:02".to_owned(), "tap-b1".to_owned())].into(),
        ..ReceiveMigrationParams::new("unix:/run/in.sock")
    });
    let snapshot = ApiRequest::Snapshot(SnapshotParams {
        destination_url: "file:///var/lib/snap".into(),
    });
    for request in [&send, &receive, &ApiRequest::Pause, &snapshot] {
        assert_eq!(h.client.call(request).unwrap(), None, "{request:?}");
    }
    assert_eq!(h.stop(), [send, receive, ApiRequest::Pause, snapshot]);
}

#[test]
fn vmm_bad_request_is_400_with_its_message() {
    let h = Harness::start();
    let request = ApiRequest::SendMigration(SendMigrationParams::new("ftp://elsewhere"));
    let (status, message) = expect_http(h.client.call(&request));
    assert_eq!(
        (status, message.as_str()),
        (400, "Invalid URL 'ftp://elsewhere'")
    );
    assert_eq!(
        h.stop(),
        [request],
        "the server let it through; the VMM refused it"
    );
}

#[test]
fn missing_or_unknown_params_are_400() {
    let h = Harness::start();
    let cases: [(Option<&[u8]>, &str); 4] = [
        (None, "Invalid request body: EOF while parsing"),
        (
            Some(b"{}"),
            "Invalid request body: missing field `destination_url`",
        ),
        (
            Some(br#"{"destination_url": "unix:/m", "bandwidth": 1}"#),
            "Invalid request body: unknown field `bandwidth`",
        ),
        (Some(b"[\"unix:/m\"]"), "Request body must be a JSON object"),
    ];
    for (body, expected) in cases {
        let r = h
            .client
            .send_raw("PUT", "/api/v1/vm.send-migration", body)
            .unwrap();
        let (status, message) = expect_http(r.into_json());
        assert_eq!(status, 400, "{body:?}");
        assert!(message.starts_with(expected), "{body:?}: {message}");
    }
    assert_eq!(h.stop(), [], "nothing reached the VMM");
}

#[test]
fn body_cap_is_413_and_exactly_the_cap_is_fine() {
    let h = Harness::start();
    let mut body = b"{}".to_vec();
    body.resize(MAX_BODY_BYTES, b' ');
    let r = h
        .client
        .send_raw("PUT", "/api/v1/vm.pause", Some(&body))
        .unwrap();
    assert_eq!(r.status, 204);

    body.push(b' ');
    let r = h
        .client
        .send_raw("PUT", "/api/v1/vm.resume", Some(&body))
        .unwrap();
    assert_eq!(r.status, 413);

    // A huge declared length is refused up front, without waiting for (or allocating) it.
    for length in ["1000000000000", "99999999999999999999999999"] {
        let request =
            format!("PUT /api/v1/vm.pause HTTP/1.1\r\nContent-Length: {length}\r\n\r\n{{}}");
        let response = raw_exchange(&h.path, request.as_bytes(), false);
        assert_eq!(status_of(&response), 413, "{response}");
        assert!(response.contains("exceeds 65536 bytes"), "{response}");
    }
    assert_eq!(info(&h).state, VmState::Paused);
}

#[test]
fn vmm_gone_is_503() {
    let dir = TempDir::new_with_prefix("/tmp/pvrdma-api-").unwrap();
    let path = dir.as_path().join("api.sock");
    let (tx, rx) = mpsc::channel();
    drop(rx);
    let _server = api::start_server(&path, tx, EventFd::new(0).unwrap()).unwrap();
    let client = api::client::ApiClient::new(&path);
    let (status, message) = expect_http(client.call(&ApiRequest::Ping));
    assert_eq!((status, message.as_str()), (503, "VMM is not running"));
}

#[test]
fn dropped_request_is_503() {
    let h = Harness::start_with(Behaviour::DropRequests, ServerOptions::default());
    let (status, message) = expect_http(h.client.call(&ApiRequest::Pause));
    assert_eq!(
        (status, message.as_str()),
        (503, "VMM dropped the request without answering")
    );
}

#[test]
fn silent_vmm_is_504() {
    let options = ServerOptions {
        reply_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let h = Harness::start_with(Behaviour::Silent, options);
    let (status, message) = expect_http(h.client.call(&ApiRequest::Pause));
    assert_eq!(status, 504);
    assert!(message.contains("may still take place"), "{message}");
}

#[test]
fn malformed_http_does_not_kill_the_server() {
    let h = Harness::start();
    let cases: [(&[u8], u16); 9] = [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /api/v1/vmm.ping\r\n\r\n", 400),
        (b"GET /api/v1/vmm.ping HTTP/2.0\r\n\r\n", 505),
        (b"GET api/v1/vmm.ping HTTP/1.1\r\n\r\n", 400),
        (b"GET /api/v1/vmm.ping HTTP/1.1\r\nNo-Colon\r\n\r\n", 400),
        (b"PUT /api/v1/vm.pause HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        (b"PUT /api/v1/vm.pause HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 501),
        (b"PUT /api/v1/vm.pause HTTP/1.1\r\nExpect: magic\r\n\r\n", 417),
    ];
    for (bytes, status) in cases {
        let response = raw_exchange(&h.path, bytes, true);
        assert_eq!(status_of(&response), status, "{bytes:?} -> {response}");
        assert!(response.contains("{\"error\":"), "{response}");
        h.assert_alive();
    }
    // An endless header line: refused once the head cap is reached.
    let mut long = b"GET /api/v1/vmm.ping HTTP/1.1\r\nX-Long: ".to_vec();
    long.resize(64 * 1024, b'a');
    assert_eq!(status_of(&raw_exchange(&h.path, &long, false)), 431);
    h.assert_alive();
    assert_eq!(
        info(&h).state,
        VmState::Running,
        "no malformed request reached the VMM"
    );
}

#[test]
fn abrupt_disconnects_do_not_kill_the_server() {
    let h = Harness::start();
    for bytes in [
        &b""[..],
        b"GET /api/v1/vmm.pi",
        b"GET /api/v1/vmm.ping HTTP/1.1\r\nHost: x\r\n",
        b"PUT /api/v1/vm.pause HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"a\":",
    ] {
        // Half-closed: the server sees EOF mid-message and closes without answering.
        assert_eq!(raw_exchange(&h.path, bytes, true), "", "{bytes:?}");
        // Fully closed, possibly before the server even reads.
        drop(UnixStream::connect(&h.path).unwrap());
        h.assert_alive();
    }
    assert_eq!(
        info(&h).state,
        VmState::Running,
        "the truncated pause never ran"
    );
}

#[test]
fn slow_client_times_out_and_others_are_served() {
    let options = ServerOptions {
        request_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let h = Harness::start_with(Behaviour::Normal, options);
    let path = h.path.clone();
    let slow = thread::spawn(move || raw_exchange(&path, b"GET /api/v1/vm", false));
    thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    h.assert_alive();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(status_of(&slow.join().unwrap()), 408);
}

#[test]
fn expect_continue_is_honoured() {
    let h = Harness::start();
    let mut stream = UnixStream::connect(&h.path).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(
            b"PUT /api/v1/vm.pause HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        )
        .unwrap();
    let mut interim = [0u8; 25];
    stream.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"{}").unwrap();
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    assert_eq!(status_of(&rest), 204, "{rest}");
}

#[test]
fn socket_is_owner_only_and_removed_on_drop() {
    let mut h = Harness::start();
    let meta = fs::symlink_metadata(&h.path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    drop(h.take_server());
    assert!(!h.path.exists());
}

#[test]
fn stale_socket_is_replaced_live_one_refused() {
    let dir = TempDir::new_with_prefix("/tmp/pvrdma-api-").unwrap();
    let path = dir.as_path().join("api.sock");
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "a stale socket file is left behind");

    let (tx, _rx) = mpsc::channel();
    let server = api::start_server(&path, tx.clone(), EventFd::new(0).unwrap()).unwrap();
    match api::start_server(&path, tx, EventFd::new(0).unwrap()) {
        Err(ApiError::InUse(p)) => assert_eq!(p, path),
        other => panic!("expected InUse, got {other:?}"),
    }
    assert!(path.exists(), "the live socket is left alone");
    drop(server);

    fs::write(&path, b"not a socket").unwrap();
    let (tx, _rx) = mpsc::channel();
    let err = api::start_server(&path, tx, EventFd::new(0).unwrap()).unwrap_err();
    assert!(matches!(err, ApiError::NotASocket(_)), "{err}");
    assert_eq!(fs::read(&path).unwrap(), b"not a socket");
}

#[test]
fn drop_is_prompt_while_waiting_for_the_vmm() {
    let mut h = Harness::start_with(Behaviour::Silent, ServerOptions::default());
    let client = h.client.clone();
    let caller = thread::spawn(move || client.call(&ApiRequest::Pause));
    // Wait until the request is with the VMM (30 s reply timeout).
    thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    drop(h.take_server());
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    let (status, message) = expect_http(caller.join().unwrap());
    assert_eq!(
        (status, message.as_str()),
        (503, "API server is shutting down")
    );
}

#[test]
fn answer_sent_before_drop_still_reaches_the_client() {
    // The VMM answers vm.shutdown, then drops the handle at once, as it does when exiting.
    let dir = TempDir::new_with_prefix("/tmp/pvrdma-api-").unwrap();
    let path = dir.as_path().join("api.sock");
    let evt = EventFd::new(0).unwrap();
    let (tx, rx) = mpsc::channel::<api::ApiMessage>();
    let server = api::start_server(&path, tx, evt.try_clone().unwrap()).unwrap();
    let client = api::client::ApiClient::new(&path);
    let caller = thread::spawn(move || client.call(&ApiRequest::Shutdown));
    evt.read().unwrap();
    let message = rx.recv().unwrap();
    message.respond(Ok(api::ResponseBody::Empty));
    drop(server);
    assert_eq!(caller.join().unwrap().unwrap(), None);
}
