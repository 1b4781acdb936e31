// SPDX-License-Identifier: Apache-2.0

//! Property tests of the HTTP layer (issue 7), through the real server on a socket: seeded
//! random and mutated requests never kill the server or reach the VMM malformed, every
//! answer is a well-formed HTTP response with a status the API documents, and no request,
//! whatever it declares, makes the process allocate more than a small bound at once.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use api::{ApiRequest, MAX_BODY_BYTES};
use common::{raw_exchange, status_of, Harness};

/// Tracks the largest single allocation of the test binary: a parser that sized a buffer
/// from a declared length would show up here.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is `System`'s; the counter has no effect on the memory returned.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract for `layout`.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through `alloc`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: the caller upholds `realloc`'s contract; `ptr` came from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// No single allocation may exceed this: the body cap plus room for the head and for the
/// test's own buffers (requests here are at most a few times the caps).
const ALLOCATION_BOUND: usize = 1 << 20;

/// xorshift64*: reproducible noise without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const METHODS: &[&str] = &["GET", "PUT", "POST", "get", "", "DELETE", "G\tET"];
const PATHS: &[&str] = &[
    "/api/v1/vmm.ping",
    "/api/v1/vm.info",
    "/api/v1/vm.pause",
    "/api/v1/vm.resume",
    "/api/v1/vm.shutdown",
    "/api/v1/vm.send-migration",
    "/api/v1/vm.snapshot",
    "/api/v1/vm.reboot",
    "/",
    "api/v1/vm.info",
    "/api/v1/vm.info?x=1",
];
const VERSIONS: &[&str] = &[
    "HTTP/1.1",
    "HTTP/1.0",
    "HTTP/2.0",
    "HTTP/1.1 extra",
    "HTX/1.1",
    "",
];
const HEADERS: &[&str] = &[
    "Host: localhost",
    "Content-Type: application/json",
    "Content-Length: 0",
    "Content-Length: 2",
    "Content-Length: 18446744073709551616",
    "Content-Length: 99999999999",
    "Content-Length: -1",
    "content-length: 2",
    "Expect: 100-continue",
    "Expect: magic",
    "Transfer-Encoding: chunked",
    " folded",
    "No-Colon",
    "Bad Name: x",
    "X-Empty:",
    "Connection: keep-alive",
];
const BODIES: &[&str] = &[
    "",
    "{}",
    " { } ",
    "[]",
    "{\"force\": true}",
    "{\"destination_url\": \"unix:/m\"}",
    "{",
    "null",
    "\u{0}",
];

/// A request assembled from plausible and hostile parts.
fn random_request(rng: &mut Rng) -> Vec<u8> {
    let eol = if rng.below(4) == 0 { "\n" } else { "\r\n" };
    let mut text = String::new();
    if rng.below(8) == 0 {
        text.push_str(eol);
    }
    text.push_str(&format!(
        "{} {} {}{eol}",
        rng.pick(METHODS),
        rng.pick(PATHS),
        rng.pick(VERSIONS)
    ));
    for _ in 0..rng.below(5) {
        text.push_str(rng.pick(HEADERS));
        text.push_str(eol);
    }
    text.push_str(eol);
    text.push_str(rng.pick(BODIES));
    text.into_bytes()
}

/// Flips, inserts, deletes or truncates a few bytes.
fn mutate(rng: &mut Rng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() + 1);
        match rng.below(4) {
            0 if at < bytes.len() => bytes[at] = rng.next() as u8,
            1 => bytes.insert(at, rng.next() as u8),
            2 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => bytes.truncate(at),
        }
    }
    bytes
}

/// Statuses the server may answer a request with (openapi.yaml), or 0: closed without an
/// answer because the request was cut short.
const STATUSES: &[u16] = &[0, 200, 204, 400, 404, 405, 409, 413, 417, 431, 505, 501];

/// The response is empty (request cut short) or one complete HTTP/1.1 message that closes
/// the connection, with a JSON error body on failure.
fn check_response(request: &[u8], response: &str) -> u16 {
    // `Expect: 100-continue` with a body still to come gets the interim response first.
    let response = response
        .strip_prefix("HTTP/1.1 100 Continue\r\n\r\n")
        .unwrap_or(response);
    let status = status_of(response);
    assert!(
        STATUSES.contains(&status),
        "{status} for {request:?}: {response}"
    );
    if status == 0 {
        assert!(response.is_empty(), "{request:?}: {response}");
        return status;
    }
    assert!(response.starts_with("HTTP/1.1 "), "{response}");
    assert!(response.contains("\r\nConnection: close\r\n"), "{response}");
    let (head, body) = response.split_once("\r\n\r\n").expect("head ends");
    if status >= 400 {
        let value: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
        assert!(value["error"].is_string(), "{response}");
    }
    if let Some(len) = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
    {
        assert_eq!(len.parse::<usize>().ok(), Some(body.len()), "{response}");
    }
    status
}

/// Runs `cases` requests from `make` against one server; the server answers each, stays
/// alive, and the VMM only ever sees well-formed requests of the route table.
/// Returns the distinct statuses seen, to show the cases reach more than one outcome.
fn run(seed: u64, cases: usize, mut make: impl FnMut(&mut Rng) -> Vec<u8>) -> BTreeSet<u16> {
    let h = Harness::start();
    let mut rng = Rng(seed);
    let mut statuses = BTreeSet::new();
    for n in 0..cases {
        let request = make(&mut rng);
        let response = raw_exchange(&h.path, &request, true);
        statuses.insert(check_response(&request, &response));
        if n % 64 == 0 {
            h.assert_alive();
        }
    }
    h.assert_alive();
    let seen = h.stop();
    assert!(
        seen.iter().all(|r| PATHS.contains(&r.route().path)),
        "only the endpoints requested reach the VMM"
    );
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= ALLOCATION_BOUND,
        "an allocation of {largest} bytes"
    );
    statuses
}

#[test]
fn random_requests_are_answered_and_never_kill_the_server() {
    let statuses = run(0x5eed_0001, 600, random_request);
    for status in [200, 204, 400, 404, 405, 413, 505, 501] {
        assert!(
            statuses.contains(&status),
            "{status} never seen: {statuses:?}"
        );
    }
}

#[test]
fn mutated_requests_are_answered_and_never_kill_the_server() {
    let statuses = run(0x5eed_0002, 600, |rng| {
        let base = random_request(rng);
        mutate(rng, base)
    });
    assert!(statuses.len() >= 5, "{statuses:?}");
}

#[test]
fn random_bytes_are_answered_and_never_kill_the_server() {
    let statuses = run(0x5eed_0003, 300, |rng| {
        let len = rng.below(300);
        (0..len).map(|_| rng.next() as u8).collect()
    });
    assert!(statuses.contains(&400), "{statuses:?}");
}

/// Oversized heads and bodies are refused from what was declared, before the rest is read
/// or any buffer of the declared size exists.
#[test]
fn declared_sizes_never_size_a_buffer() {
    let h = Harness::start();
    let mut rng = Rng(0x5eed_0004);
    for _ in 0..50 {
        let declared = MAX_BODY_BYTES + 1 + rng.below(1 << 40);
        let request =
            format!("PUT /api/v1/vm.pause HTTP/1.1\r\nContent-Length: {declared}\r\n\r\n{{}}");
        let response = raw_exchange(&h.path, request.as_bytes(), false);
        assert_eq!(status_of(&response), 413, "{response}");
    }
    for extra in [1, 100, 5000] {
        let mut request = b"GET /api/v1/vmm.ping HTTP/1.1\r\nX: ".to_vec();
        request.resize(8 * 1024 + extra, b'a');
        let response = raw_exchange(&h.path, &request, false);
        assert_eq!(status_of(&response), 431, "{response}");
    }
    h.assert_alive();
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= ALLOCATION_BOUND,
        "an allocation of {largest} bytes"
    );
    let seen = h.stop();
    assert!(
        seen.iter().all(|r| *r == ApiRequest::Ping),
        "only the liveness pings reached the VMM: {seen:?}"
    );
}
