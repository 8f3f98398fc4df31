//! The bearer token of a request, and the claims read from it (expiry, audiences) before any
//! review: a token that cannot pass is refused without asking the API server.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;

use super::error::Unauthenticated;

/// The claims of a JWT read without verifying it (the TokenReview verifies), to say early and
/// precisely why a token cannot pass, and to keep a verdict no longer than the token lives.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct Claims {
    /// When the token expires (seconds since the epoch), if it says.
    pub(super) exp: Option<u64>,
    /// The audiences it is for.
    #[serde(default, deserialize_with = "one_or_many")]
    pub(super) aud: Vec<String>,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(
        match <Option<OneOrMany> as serde::Deserialize>::deserialize(d)? {
            None => Vec::new(),
            Some(OneOrMany::One(a)) => vec![a],
            Some(OneOrMany::Many(a)) => a,
        },
    )
}

/// The claims of `token` if it is a JWT (static and other opaque tokens have none).
pub(super) fn claims(token: &str) -> Option<Claims> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The token of an `authorization` header value.
pub fn bearer_token(header: Option<&[u8]>) -> Result<&str, Unauthenticated> {
    let Some(header) = header else {
        return Err(Unauthenticated::Missing {
            audiences: String::new(),
        });
    };
    let text = std::str::from_utf8(header)
        .map_err(|_| Unauthenticated::Malformed("the authorization header is not text"))?;
    let (scheme, token) = text
        .split_once(' ')
        .ok_or(Unauthenticated::Malformed("expected `Bearer <token>`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Unauthenticated::Malformed(
            "only the Bearer scheme is accepted",
        ));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(Unauthenticated::Malformed("the bearer token is empty"));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Unauthenticated::Malformed(
            "the bearer token holds whitespace",
        ));
    }
    Ok(token)
}

/// A JWT with `claims` (JSON) and no valid signature, as tests need one.
#[cfg(test)]
pub(super) fn jwt(claims: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!("{}.{}.sig", b64(r#"{"alg":"RS256"}"#), b64(claims))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_parsed_or_refused_with_the_reason() {
        assert_eq!(bearer_token(Some(b"Bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(Some(b"bearer  abc ")), Ok("abc"));
        assert!(matches!(
            bearer_token(None),
            Err(Unauthenticated::Missing { .. })
        ));
        for (header, why) in [
            (&b"Basic abc"[..], "only the Bearer scheme"),
            (b"Bearer", "expected `Bearer <token>`"),
            (b"Bearer ", "empty"),
            (b"Bearer a b", "whitespace"),
            (b"Bearer \xff", "not text"),
        ] {
            let e = bearer_token(Some(header)).unwrap_err();
            assert!(e.to_string().contains(why), "{header:?}: {e}");
        }
    }

    #[test]
    fn claims_are_read_from_jwts_only() {
        let c = claims(&jwt(r#"{"exp":5,"aud":["a","b"]}"#)).unwrap();
        assert_eq!((c.exp, c.aud), (Some(5), vec!["a".into(), "b".into()]));
        let c = claims(&jwt(r#"{"aud":"a"}"#)).unwrap();
        assert_eq!((c.exp, c.aud), (None, vec!["a".to_owned()]));
        assert!(claims("opaque-static-token").is_none());
        assert!(claims("a.b.c.d").is_none());
        assert!(claims("a.!!!.c").is_none());
    }

    #[test]
    fn messages_never_carry_the_token() {
        let token = jwt(r#"{"exp":1,"aud":["other"]}"#);
        let header = format!("Bearer {token}");
        let e = bearer_token(Some(header.as_bytes())).map(|t| claims(t).unwrap());
        let claims = e.unwrap();
        let errors = [
            Unauthenticated::Expired(unix_now() - claims.exp.unwrap()),
            Unauthenticated::WrongAudience {
                got: claims.aud,
                want: "kube-dispatch".into(),
            },
        ];
        for e in errors {
            assert!(!e.to_string().contains(&token), "{e}");
        }
    }

    mod fuzzed {
        use proptest::prelude::*;

        use super::super::*;

        proptest! {
            /// Any header value: no panic; a token taken is non-empty, free of whitespace,
            /// read back the same from `Bearer <token>`; a refusal never repeats the header.
            #[test]
            fn any_header_is_parsed_or_refused(header in proptest::collection::vec(any::<u8>(), 0..200)) {
                match bearer_token(Some(&header)) {
                    Ok(token) => {
                        prop_assert!(!token.is_empty());
                        prop_assert!(!token.chars().any(|c| c.is_whitespace() || c.is_control()));
                        let again = format!("Bearer {token}");
                        prop_assert_eq!(bearer_token(Some(again.as_bytes())), Ok(token));
                    }
                    Err(e) => {
                        let text = String::from_utf8_lossy(&header);
                        let secret = text.split_once(' ').map_or(&*text, |(_, rest)| rest).trim();
                        if secret.len() >= 4 {
                            prop_assert!(!e.to_string().contains(secret), "{e}");
                        }
                    }
                }
            }

            /// Any text as a token: reading claims never panics.
            #[test]
            fn any_token_is_read_or_skipped(token in "\\PC{0,300}") {
                let _ = claims(&token);
            }

            /// The claims of any well-formed JWT are read back as written.
            #[test]
            fn jwt_claims_round_trip(
                exp in proptest::option::of(any::<u64>()),
                aud in proptest::collection::vec("[a-z0-9.:/-]{1,20}", 0..4),
            ) {
                let json = serde_json::json!({ "exp": exp, "aud": aud }).to_string();
                let read = claims(&jwt(&json)).expect("claims of a JWT");
                prop_assert_eq!((read.exp, read.aud), (exp, aud));
            }
        }
    }
}
