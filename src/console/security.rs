//! The rules that keep a local console local (no client required, pure): where it listens, the
//! per-run token every request must carry (cookie or URL), and the checks on requests that change
//! something — the token in the form or a header, and an `Origin` that is the console itself, so a
//! page of another site cannot act through the user's browser.

use std::net::{IpAddr, Ipv4Addr};

/// The cookie that carries the token after the first visit.
pub const COOKIE: &str = "ax_console_token";
/// The form field of the token on state-changing requests.
pub const FORM_FIELD: &str = "token";
/// The header of the token on state-changing requests sent by script.
pub const HEADER: &str = "x-ax-token";

/// Where to listen: loopback unless an address was asked for.
pub fn bind_address(asked: Option<IpAddr>) -> IpAddr {
    asked.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A token from 32 random bytes, as hex (the caller supplies the randomness).
pub fn token_from(bytes: [u8; 32]) -> String {
    crate::core::hex(&bytes)
}

/// Compares in time independent of where the first difference is.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of one cookie in a `Cookie` header.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// What the checks look at in one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts<'a> {
    /// Changes something (POST): needs the presented token and our Origin.
    pub state_changing: bool,
    /// The `Host` header.
    pub host: Option<&'a str>,
    /// The `Origin` header.
    pub origin: Option<&'a str>,
    /// The token in the cookie.
    pub cookie_token: Option<&'a str>,
    /// The token in the URL (`?token=`), the form field or the header.
    pub presented_token: Option<&'a str>,
}

/// Why a request is refused (403).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No valid token: not opened from the URL `kubectl ax ui` printed.
    NoToken,
    /// A state-changing request without the token in its form or header (the cookie alone is not
    /// enough: a browser sends it whoever made the page).
    NoPresentedToken,
    /// No `Origin` header on a state-changing request.
    NoOrigin,
    /// The `Origin` is another site.
    ForeignOrigin(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NoToken => f.write_str(
                "no valid console token: open the URL that `kubectl ax ui` printed (it ends in ?token=...)",
            ),
            Refusal::NoPresentedToken => f.write_str(
                "refused: a request that changes something must carry the console token in its form or the X-Ax-Token header",
            ),
            Refusal::NoOrigin => {
                f.write_str("refused: a request that changes something must say its Origin")
            }
            Refusal::ForeignOrigin(origin) => write!(
                f,
                "refused: a request from {origin:?} may not change anything through this console"
            ),
        }
    }
}

/// Every request needs the token (cookie or URL); a state-changing one also needs it presented
/// in the form or a header, and an `Origin` equal to `http://<Host>`: the page that sent it was
/// served by this console.
pub fn check(facts: &RequestFacts, secret: &str) -> Result<(), Refusal> {
    let valid = |t: Option<&str>| t.is_some_and(|t| same_secret(t, secret));
    if !facts.state_changing {
        return if valid(facts.cookie_token) || valid(facts.presented_token) {
            Ok(())
        } else {
            Err(Refusal::NoToken)
        };
    }
    if !valid(facts.presented_token) {
        return Err(Refusal::NoPresentedToken);
    }
    let Some(origin) = facts.origin else {
        return Err(Refusal::NoOrigin);
    };
    let ours = facts.host.map(|h| format!("http://{h}"));
    if ours.as_deref() != Some(origin) {
        return Err(Refusal::ForeignOrigin(origin.to_owned()));
    }
    Ok(())
}

/// A path to go back to after an action: only a path of this console, never another site
/// (`//evil.example` and `/\evil` would leave it).
pub fn safe_return(path: &str) -> &str {
    let ok = path.starts_with('/')
        && !path.starts_with("//")
        && !path.starts_with("/\\")
        && !path.chars().any(|c| c.is_control());
    if ok { path } else { "/" }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123abcd";

    fn post<'a>(origin: Option<&'a str>, token: Option<&'a str>) -> RequestFacts<'a> {
        RequestFacts {
            state_changing: true,
            host: Some("127.0.0.1:8080"),
            origin,
            cookie_token: Some(SECRET),
            presented_token: token,
        }
    }

    #[test]
    fn listens_on_loopback_unless_told_otherwise() {
        assert_eq!(bind_address(None), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        assert_eq!(bind_address(Some(any)), any);
    }

    #[test]
    fn tokens_are_hex_of_all_bytes() {
        let t = token_from([0xab; 32]);
        assert_eq!(t.len(), 64);
        assert!(t.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(token_from([0; 32]), token_from([1; 32]));
    }

    #[test]
    fn pages_need_the_token_in_the_cookie_or_the_url() {
        let mut get = RequestFacts::default();
        assert_eq!(check(&get, SECRET), Err(Refusal::NoToken));
        get.cookie_token = Some("wrong");
        assert_eq!(check(&get, SECRET), Err(Refusal::NoToken));
        get.cookie_token = Some(SECRET);
        assert_eq!(check(&get, SECRET), Ok(()));
        let by_url = RequestFacts {
            presented_token: Some(SECRET),
            ..RequestFacts::default()
        };
        assert_eq!(check(&by_url, SECRET), Ok(()));
    }

    #[test]
    fn a_change_needs_the_presented_token_and_our_origin() {
        assert_eq!(
            check(&post(Some("http://127.0.0.1:8080"), Some(SECRET)), SECRET),
            Ok(())
        );
        // The cookie alone is what a foreign page's form would carry.
        assert_eq!(
            check(&post(Some("http://127.0.0.1:8080"), None), SECRET),
            Err(Refusal::NoPresentedToken)
        );
        assert_eq!(
            check(&post(Some("http://127.0.0.1:8080"), Some("guess")), SECRET),
            Err(Refusal::NoPresentedToken)
        );
        assert_eq!(
            check(&post(None, Some(SECRET)), SECRET),
            Err(Refusal::NoOrigin)
        );
        for foreign in [
            "https://evil.example",
            "http://127.0.0.1:8081",
            "null",
            "http://127.0.0.1:8080.evil.example",
        ] {
            assert_eq!(
                check(&post(Some(foreign), Some(SECRET)), SECRET),
                Err(Refusal::ForeignOrigin(foreign.into())),
                "{foreign}"
            );
        }
    }

    #[test]
    fn cookies_are_found_by_name() {
        let header = "a=1; ax_console_token=xyz; b=2";
        assert_eq!(cookie_value(header, COOKIE), Some("xyz"));
        assert_eq!(cookie_value(header, "c"), None);
        assert_eq!(cookie_value("ax_console_token_old=1", COOKIE), None);
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }

    #[test]
    fn return_paths_stay_in_the_console() {
        assert_eq!(safe_return("/tasks?phase=Dead"), "/tasks?phase=Dead");
        for bad in [
            "https://evil.example",
            "//evil.example",
            "/\\evil",
            "tasks",
            "/a\nb",
        ] {
            assert_eq!(safe_return(bad), "/", "{bad}");
        }
    }
}
