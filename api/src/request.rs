// SPDX-License-Identifier: Apache-2.0

//! The route table: which method and path make which [`ApiRequest`], and how its body is read.
//!
//! [`ROUTES`] is the single list of endpoints. The server routes with it, the client finds
//! where to send a request through [`ApiRequest::route`], and a unit test checks it against
//! `openapi.yaml` in both directions.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::types::ApiRequest;

/// HTTP methods the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Reads state, changes nothing.
    Get,
    /// Performs an action.
    Put,
}

impl Method {
    /// The method as it appears on the request line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Put => "PUT",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Turns a request body into the request; errors become HTTP 400.
type ParseFn = fn(&[u8]) -> Result<ApiRequest, RouteError>;

/// One endpoint: the only method it accepts, its full path, and its body parser.
#[derive(Debug)]
pub struct Route {
    /// The method the endpoint accepts; any other gets 405.
    pub method: Method,
    /// Full request path, `/api/v1/...`.
    pub path: &'static str,
    parse: ParseFn,
}

const VMM_PING: Route = Route {
    method: Method::Get,
    path: "/api/v1/vmm.ping",
    parse: |body| check_no_body(body).map(|()| ApiRequest::Ping),
};

const VM_INFO: Route = Route {
    method: Method::Get,
    path: "/api/v1/vm.info",
    parse: |body| check_no_body(body).map(|()| ApiRequest::VmInfo),
};

const VM_COUNTERS: Route = Route {
    method: Method::Get,
    path: "/api/v1/vm.counters",
    parse: |body| check_no_body(body).map(|()| ApiRequest::Counters),
};

const VM_PAUSE: Route = Route {
    method: Method::Put,
    path: "/api/v1/vm.pause",
    parse: |body| check_no_params(body).map(|()| ApiRequest::Pause),
};

const VM_RESUME: Route = Route {
    method: Method::Put,
    path: "/api/v1/vm.resume",
    parse: |body| check_no_params(body).map(|()| ApiRequest::Resume),
};

const VM_SHUTDOWN: Route = Route {
    method: Method::Put,
    path: "/api/v1/vm.shutdown",
    parse: |body| check_no_params(body).map(|()| ApiRequest::Shutdown),
};

const VM_SEND_MIGRATION: Route = Route {
    method: Method::Put,
    path: "/api/v1/vm.send-migration",
    parse: |body| json_body(body).map(ApiRequest::SendMigration),
};

const VM_CANCEL_MIGRATION: Route = Route {
    method: Method::Put,
    path: "/api/v1/vm.cancel-migration",
    parse: |body| check_no_params(body).map(|()| ApiRequest::CancelMigration),
};

const VM_RECEIVE_MIGRATION: Route = Route {
    method: Method::Put,
    path: "/api/v1/vm.receive-migration",
    parse: |body| json_body(body).map(ApiRequest::ReceiveMigration),
};

const VM_SNAPSHOT: Route = Route {
    method: Method::Put,
    path: "/api/v1/vm.snapshot",
    parse: |body| json_body(body).map(ApiRequest::Snapshot),
};

/// Every endpoint the server serves.
pub static ROUTES: &[Route] = &[
    VMM_PING,
    VM_INFO,
    VM_COUNTERS,
    VM_PAUSE,
    VM_RESUME,
    VM_SHUTDOWN,
    VM_SEND_MIGRATION,
    VM_CANCEL_MIGRATION,
    VM_RECEIVE_MIGRATION,
    VM_SNAPSHOT,
];

impl ApiRequest {
    /// The endpoint this request is sent to.
    pub fn route(&self) -> &'static Route {
        match self {
            Self::Ping => &VMM_PING,
            Self::VmInfo => &VM_INFO,
            Self::Counters => &VM_COUNTERS,
            Self::Pause => &VM_PAUSE,
            Self::Resume => &VM_RESUME,
            Self::Shutdown => &VM_SHUTDOWN,
            Self::SendMigration(_) => &VM_SEND_MIGRATION,
            Self::CancelMigration => &VM_CANCEL_MIGRATION,
            Self::ReceiveMigration(_) => &VM_RECEIVE_MIGRATION,
            Self::Snapshot(_) => &VM_SNAPSHOT,
        }
    }

    /// The JSON body this request is sent with: its parameters, if it has any. The route's
    /// parser reads it back into the same request.
    pub fn body(&self) -> Option<Vec<u8>> {
        match self {
            Self::Ping
            | Self::VmInfo
            | Self::Counters
            | Self::Pause
            | Self::Resume
            | Self::Shutdown
            | Self::CancelMigration => None,
            Self::SendMigration(params) => Some(to_json(params)),
            Self::ReceiveMigration(params) => Some(to_json(params)),
            Self::Snapshot(params) => Some(to_json(params)),
        }
    }
}

/// Serialises a parameter struct.
fn to_json<T: Serialize>(params: &T) -> Vec<u8> {
    #[allow(clippy::expect_used)] // Cannot fail for these types; the round-trip test covers them.
    serde_json::to_vec(params)
        .expect("parameter structs hold only strings, integers and string-keyed maps")
}

/// Why a well-formed HTTP request is not a valid API request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RouteError {
    /// No endpoint has this path.
    #[error("Unknown endpoint {0}")]
    NotFound(String),
    /// The path exists but takes another method.
    #[error("Method {method} is not allowed on this endpoint; use {allowed}")]
    MethodNotAllowed {
        /// What the client sent.
        method: String,
        /// What the endpoint takes; sent back in the `Allow` header.
        allowed: Method,
    },
    /// A GET carried a body.
    #[error("This endpoint takes no request body")]
    UnexpectedBody,
    /// The body is JSON but not an object.
    #[error("Request body must be a JSON object")]
    NotAnObject,
    /// The body is not JSON, or not the JSON this endpoint takes. The serde message is part
    /// of the text because it is all the client gets to see.
    #[error("Invalid request body: {0}")]
    InvalidBody(serde_json::Error),
}

impl RouteError {
    /// HTTP status code of this error.
    pub(crate) fn status(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::MethodNotAllowed { .. } => 405,
            Self::UnexpectedBody | Self::NotAnObject | Self::InvalidBody(_) => 400,
        }
    }
}

/// Maps a request line and body to an [`ApiRequest`].
///
/// The path is matched first so that a known path with the wrong method gets 405, not 404,
/// and the body is only looked at once method and path are right.
pub(crate) fn parse_request(
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<ApiRequest, RouteError> {
    let route = ROUTES
        .iter()
        .find(|route| route.path == path)
        .ok_or_else(|| RouteError::NotFound(path.to_owned()))?;
    if method != route.method.as_str() {
        return Err(RouteError::MethodNotAllowed {
            method: method.to_owned(),
            allowed: route.method,
        });
    }
    (route.parse)(body)
}

/// Reads a JSON body into an endpoint's parameter struct; such structs carry
/// `#[serde(deny_unknown_fields)]` so that a misspelt option is an error, not a silent default.
/// Only an object is accepted: serde would also take an array as a struct's fields in order.
fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, RouteError> {
    let value: Value = serde_json::from_slice(body).map_err(RouteError::InvalidBody)?;
    if !value.is_object() {
        return Err(RouteError::NotAnObject);
    }
    serde_json::from_value(value).map_err(RouteError::InvalidBody)
}

/// GET endpoints take no body at all.
fn check_no_body(body: &[u8]) -> Result<(), RouteError> {
    if body.is_empty() {
        Ok(())
    } else {
        Err(RouteError::UnexpectedBody)
    }
}

/// Parameters of an action that has none: only `{}` is accepted.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

/// Actions without parameters accept an empty body or `{}`, so that clients which always send
/// a JSON object work, while any field (a parameter this version does not know) is refused.
fn check_no_params(body: &[u8]) -> Result<(), RouteError> {
    if body.is_empty() {
        return Ok(());
    }
    json_body::<NoParams>(body).map(|NoParams {}| ())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::types::{ReceiveMigrationParams, SendMigrationParams, SnapshotParams, TlsParams};

    /// `(method, path)` pairs under `paths:` in the OpenAPI document, found by indentation:
    /// paths at two spaces, operations at four.
    fn openapi_routes() -> BTreeSet<(String, String)> {
        let yaml = include_str!("../openapi.yaml");
        let mut routes = BTreeSet::new();
        let mut in_paths = false;
        let mut path = None;
        for line in yaml.lines() {
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            if !line.starts_with(' ') {
                in_paths = line == "paths:";
                continue;
            }
            if !in_paths {
                continue;
            }
            if let Some(key) = line.strip_prefix("  /") {
                path = Some(format!("/{}", key.trim_end().trim_end_matches(':')));
            } else if let Some(op) = line.strip_prefix("    ") {
                let op = op.trim_end();
                if !op.starts_with(' ') && op.ends_with(':') {
                    let method = op.trim_end_matches(':').to_ascii_uppercase();
                    if ["GET", "PUT", "POST", "DELETE", "PATCH"].contains(&method.as_str()) {
                        routes.insert((method, path.clone().expect("operation outside a path")));
                    }
                }
            }
        }
        routes
    }

    #[test]
    fn openapi_documents_exactly_the_routes() {
        let served: BTreeSet<_> = ROUTES
            .iter()
            .map(|r| (r.method.as_str().to_owned(), r.path.to_owned()))
            .collect();
        let documented = openapi_routes();
        assert!(!documented.is_empty());
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let unserved: Vec<_> = documented.difference(&served).collect();
        assert!(
            undocumented.is_empty(),
            "missing in openapi.yaml: {undocumented:?}"
        );
        assert!(
            unserved.is_empty(),
            "in openapi.yaml but not served: {unserved:?}"
        );
    }

    /// One request of every kind, parameters filled in where there are some.
    fn samples() -> Vec<ApiRequest> {
        vec![
            ApiRequest::Ping,
            ApiRequest::VmInfo,
            ApiRequest::Counters,
            ApiRequest::Pause,
            ApiRequest::Resume,
            ApiRequest::Shutdown,
            ApiRequest::SendMigration(SendMigrationParams {
                destination_url: "tcp:10.0.0.2:6000".into(),
                downtime_ms: 50,
                timeout_s: 60,
                tls: Some(TlsParams {
                    cert: "/etc/m/cert.pem".into(),
                    key: "/etc/m/key.pem".into(),
                    ca: "/etc/m/ca.pem".into(),
                }),
                allow_plaintext: false,
            }),
            ApiRequest::CancelMigration,
            ApiRequest::ReceiveMigration(ReceiveMigrationParams {
                taps: [("52:54:00:00:00:02".to_owned(), "tap-b1".to_owned())].into(),
                disks: [("/src/a.img".into(), "/dst/a.img".into())].into(),
                disk_dirs: vec!["/var/disks".into()],
                max_memory_mib: Some(4096),
                allow_plaintext: true,
                ..ReceiveMigrationParams::new("unix:/run/migrate.sock")
            }),
            ApiRequest::Snapshot(SnapshotParams {
                destination_url: "file:///var/lib/snap".into(),
            }),
        ]
    }

    /// What the client sends for each request is what the server makes of it, and the samples
    /// cover every route.
    #[test]
    fn every_route_parses_back_to_itself() {
        let samples = samples();
        for request in &samples {
            let route = request.route();
            let body = request.body().unwrap_or_default();
            let parsed = parse_request(route.method.as_str(), route.path, &body).unwrap();
            assert_eq!(&parsed, request);
        }
        let covered: BTreeSet<_> = samples.iter().map(|r| r.route().path).collect();
        let all: BTreeSet<_> = ROUTES.iter().map(|r| r.path).collect();
        assert_eq!(covered, all, "a route without a sample");
    }

    #[test]
    fn params_take_defaults() {
        let send = "/api/v1/vm.send-migration";
        assert_eq!(
            parse_request("PUT", send, br#"{"destination_url": "unix:/m.sock"}"#).unwrap(),
            ApiRequest::SendMigration(SendMigrationParams::new("unix:/m.sock"))
        );
        assert_eq!(
            parse_request(
                "PUT",
                send,
                br#"{"destination_url": "unix:/m.sock", "timeout_s": 5}"#
            )
            .unwrap(),
            ApiRequest::SendMigration(SendMigrationParams {
                timeout_s: 5,
                ..SendMigrationParams::new("unix:/m.sock")
            })
        );
        assert_eq!(
            parse_request(
                "PUT",
                "/api/v1/vm.receive-migration",
                br#"{"receiver_url": "tcp:0.0.0.0:6000"}"#
            )
            .unwrap(),
            ApiRequest::ReceiveMigration(ReceiveMigrationParams::new("tcp:0.0.0.0:6000"))
        );
    }

    #[test]
    fn params_refuse_unknown_and_missing_fields() {
        let cases: [(&str, &[u8], &str); 8] = [
            ("vm.send-migration", b"", "EOF while parsing"),
            (
                "vm.send-migration",
                b"{}",
                "missing field `destination_url`",
            ),
            (
                "vm.send-migration",
                br#"{"destination_url": "unix:/m", "downtime": 5}"#,
                "unknown field `downtime`",
            ),
            (
                "vm.send-migration",
                br#"{"destination_url": "unix:/m", "timeout_s": -1}"#,
                "invalid value",
            ),
            (
                "vm.receive-migration",
                b"{}",
                "missing field `receiver_url`",
            ),
            (
                "vm.receive-migration",
                br#"{"receiver_url": "unix:/m", "taps": {"52:54:00:00:00:02": 7}}"#,
                "invalid type",
            ),
            ("vm.snapshot", b"{}", "missing field `destination_url`"),
            (
                "vm.snapshot",
                br#"{"destination_url": "file:///s", "compress": true}"#,
                "unknown field `compress`",
            ),
        ];
        for (endpoint, body, expected) in cases {
            let err = parse_request("PUT", &format!("/api/v1/{endpoint}"), body).unwrap_err();
            assert_eq!(err.status(), 400, "{endpoint} {body:?}");
            assert!(err.to_string().contains(expected), "{endpoint}: {err}");
        }
    }

    #[test]
    fn routes_are_unique() {
        let paths: BTreeSet<_> = ROUTES.iter().map(|r| r.path).collect();
        assert_eq!(paths.len(), ROUTES.len());
    }

    #[test]
    fn requests() {
        assert_eq!(
            parse_request("GET", "/api/v1/vmm.ping", b"").unwrap(),
            ApiRequest::Ping
        );
        assert_eq!(
            parse_request("GET", "/api/v1/vm.info", b"").unwrap(),
            ApiRequest::VmInfo
        );
        assert_eq!(
            parse_request("GET", "/api/v1/vm.counters", b"").unwrap(),
            ApiRequest::Counters
        );
        assert_eq!(
            parse_request("PUT", "/api/v1/vm.pause", b"").unwrap(),
            ApiRequest::Pause
        );
        assert_eq!(
            parse_request("PUT", "/api/v1/vm.resume", b"{}").unwrap(),
            ApiRequest::Resume
        );
        assert_eq!(
            parse_request("PUT", "/api/v1/vm.shutdown", b" { } ").unwrap(),
            ApiRequest::Shutdown
        );
    }

    #[test]
    fn unknown_path_is_404() {
        for path in [
            "/api/v1/vm.reboot",
            "/api/v1/vm.info/",
            "/api/v1/vm.info?x=1",
            "/",
            "",
        ] {
            let err = parse_request("GET", path, b"").unwrap_err();
            assert_eq!(err.status(), 404, "{path}");
        }
    }

    #[test]
    fn wrong_method_is_405_with_allow() {
        let err = parse_request("POST", "/api/v1/vm.pause", b"").unwrap_err();
        assert_eq!(err.status(), 405);
        assert!(matches!(
            err,
            RouteError::MethodNotAllowed {
                allowed: Method::Put,
                ..
            }
        ));
        let err = parse_request("PUT", "/api/v1/vm.info", b"").unwrap_err();
        assert!(matches!(
            err,
            RouteError::MethodNotAllowed {
                allowed: Method::Get,
                ..
            }
        ));
        // Methods are case-sensitive (RFC 9110 §9.1).
        assert_eq!(
            parse_request("get", "/api/v1/vm.info", b"")
                .unwrap_err()
                .status(),
            405
        );
    }

    #[test]
    fn method_is_checked_before_body() {
        let err = parse_request("GET", "/api/v1/vm.pause", b"not json").unwrap_err();
        assert_eq!(err.status(), 405);
    }

    #[test]
    fn bad_bodies_are_400() {
        let cases: [(&str, &str, &[u8]); 6] = [
            ("PUT", "/api/v1/vm.pause", b"{"),
            ("PUT", "/api/v1/vm.pause", b"[]"),
            ("PUT", "/api/v1/vm.pause", b"{\"force\": true}"),
            ("PUT", "/api/v1/vm.shutdown", b"\xff\xfe"),
            ("GET", "/api/v1/vm.info", b"{}"),
            ("GET", "/api/v1/vm.counters", b"{}"),
        ];
        for (method, path, body) in cases {
            let err = parse_request(method, path, body).unwrap_err();
            assert_eq!(err.status(), 400, "{method} {path} {body:?}");
        }
        let err = parse_request("PUT", "/api/v1/vm.pause", b"{\"force\": true}").unwrap_err();
        assert!(err.to_string().contains("unknown field `force`"), "{err}");
        let err = parse_request("PUT", "/api/v1/vm.pause", b"[]").unwrap_err();
        assert_eq!(err.to_string(), "Request body must be a JSON object");
        let deep = "[".repeat(10_000);
        assert_eq!(
            parse_request("PUT", "/api/v1/vm.pause", deep.as_bytes())
                .unwrap_err()
                .status(),
            400
        );
    }
}
