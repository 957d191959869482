//! Which endpoint a method and a path (relative to where the service is mounted) name.

use http::Method;

use super::json::Refusal;
use super::params::percent_decode;
use crate::store::StoreKey;

/// An endpoint, with the key or id its path names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// `GET /`: the page (HTML).
    Page,
    /// `POST /`: a form of the page.
    Act,
    Counts,
    List,
    Find(StoreKey),
    FindById(String),
    Requeue(StoreKey),
    Discard(StoreKey),
    RequeueMatching,
    Pause,
    Resume,
}

impl Endpoint {
    /// Its name in log lines.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Endpoint::Page => "page",
            Endpoint::Act => "page_action",
            Endpoint::Counts => "counts",
            Endpoint::List => "list",
            Endpoint::Find(_) => "find",
            Endpoint::FindById(_) => "find_by_id",
            Endpoint::Requeue(_) => "requeue",
            Endpoint::Discard(_) => "discard",
            Endpoint::RequeueMatching => "requeue_matching",
            Endpoint::Pause => "pause",
            Endpoint::Resume => "resume",
        }
    }
}

/// Reads an endpoint from its path's segments.
type Parse = fn(&[&str]) -> Result<Endpoint, Refusal>;

/// The endpoint of `method` on `path`: 404 for a path it does not serve, 405 for another
/// method, 400 for a key that is not a printed store key (once the method is right).
pub(super) fn resolve(method: &Method, path: &str) -> Result<Endpoint, Refusal> {
    let path = path.strip_suffix('/').unwrap_or(path);
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let (wanted, endpoint): (Method, Parse) = match segments.as_slice() {
        [] if *method == Method::POST => (Method::POST, |_| Ok(Endpoint::Act)),
        [] => (Method::GET, |_| Ok(Endpoint::Page)),
        ["counts"] => (Method::GET, |_| Ok(Endpoint::Counts)),
        ["entries"] => (Method::GET, |_| Ok(Endpoint::List)),
        ["entries", "by-id", _] => (Method::GET, |s| Ok(Endpoint::FindById(segment(s[2])?))),
        ["entries", _] => (Method::GET, |s| Ok(Endpoint::Find(key(s[1])?))),
        ["entries", _, "requeue"] => (Method::POST, |s| Ok(Endpoint::Requeue(key(s[1])?))),
        ["entries", _, "discard"] => (Method::POST, |s| Ok(Endpoint::Discard(key(s[1])?))),
        ["requeue"] => (Method::POST, |_| Ok(Endpoint::RequeueMatching)),
        ["pause"] => (Method::POST, |_| Ok(Endpoint::Pause)),
        ["resume"] => (Method::POST, |_| Ok(Endpoint::Resume)),
        _ => return Err(Refusal::NoPath),
    };
    if *method != wanted {
        return Err(Refusal::Method { allow: wanted });
    }
    endpoint(&segments)
}

/// A path segment, percent-decoded.
fn segment(raw: &str) -> Result<String, Refusal> {
    let decoded = percent_decode(raw, false);
    decoded.ok_or_else(|| {
        Refusal::BadParameter("a path segment is not valid percent-encoded UTF-8".to_owned())
    })
}

/// The store key a path segment prints.
fn key(raw: &str) -> Result<StoreKey, Refusal> {
    StoreKey::parse(&segment(raw)?).ok_or_else(|| {
        Refusal::BadParameter(
            "not a store key: `ti:` and 16 base64url digits, as listed (for a delivery id, use \
             /entries/by-id/{id})"
                .to_owned(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_endpoints_wherever_the_service_is_mounted() {
        let key = StoreKey::new("email", None, "evt_1");
        let get = |path: &str| resolve(&Method::GET, path);
        let post = |path: &str| resolve(&Method::POST, path);
        assert_eq!(get("/counts").unwrap(), Endpoint::Counts);
        assert_eq!(get("/entries/").unwrap(), Endpoint::List);
        assert_eq!(
            get(&format!("/entries/{key}")).unwrap(),
            Endpoint::Find(key.clone())
        );
        let escaped = format!("/entries/{}", key.as_str().replace(':', "%3A"));
        assert_eq!(get(&escaped).unwrap(), Endpoint::Find(key.clone()));
        assert_eq!(
            get("/entries/by-id/evt%201").unwrap(),
            Endpoint::FindById("evt 1".into())
        );
        assert_eq!(
            post(&format!("/entries/{key}/requeue")).unwrap(),
            Endpoint::Requeue(key.clone())
        );
        assert_eq!(
            post(&format!("/entries/{key}/discard")).unwrap(),
            Endpoint::Discard(key)
        );
        assert_eq!(post("/requeue").unwrap(), Endpoint::RequeueMatching);
        assert_eq!(post("/pause").unwrap(), Endpoint::Pause);
        assert_eq!(post("/resume").unwrap(), Endpoint::Resume);
        assert_eq!(get("/").unwrap(), Endpoint::Page);
        assert_eq!(get("").unwrap(), Endpoint::Page);
        assert_eq!(post("/").unwrap(), Endpoint::Act);
        assert!(matches!(get("//"), Err(Refusal::NoPath)));
        assert!(matches!(get("/counts/x"), Err(Refusal::NoPath)));
        assert!(matches!(post("/counts"), Err(Refusal::Method { allow }) if allow == Method::GET));
        assert!(matches!(get("/pause"), Err(Refusal::Method { allow }) if allow == Method::POST));
        assert!(matches!(
            get("/entries/evt_1"),
            Err(Refusal::BadParameter(_))
        ));
        assert!(matches!(
            get("/entries/by-id/%FF"),
            Err(Refusal::BadParameter(_))
        ));
    }
}
