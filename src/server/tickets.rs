//! Event-stream tickets any server can check: a ticket is `{run, principal, expiry, nonce}`
//! signed with HMAC-SHA256 under a key every server of one deployment derives alike, so a page
//! behind a load balancer may get its ticket from one server and open the stream on another.
//!
//! The key: `DAGLOOP_TICKET_KEY` when the operator sets it (the same secret on every server),
//! else derived from the principals the server knows (their names, roles and token hashes, and
//! the legacy `DAGLOOP_TOKEN`'s hash): servers sharing the operator's principals share the key
//! with nothing more to set up, and changing a principal's token or roles revokes every ticket
//! out. Whoever can read the principal list could then mint tickets (open event streams as any
//! principal for 60 seconds, nothing else), which is why the explicit key exists.
//!
//! Single use: each server remembers the nonces it redeemed until they expire, so a ticket
//! opens one stream on one server. A ticket replayed on *another* server within its 60 seconds
//! opens that one run's event stream there once more, as the principal it was issued to (who
//! may read that run anyway: the handler checks again): it opens no other run and no other
//! route. Recording the redemption where every server sees it (the run's workflow) would cost
//! an update — a workflow task and history events — per stream opened, and a finished run's
//! workflow takes no update at all; docs/temporal.md says more.
//!
//! Deliberately not here: reading tickets off a request and answering 401 (`auth`), or who may
//! read a run (the handlers).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;
use serde::{Deserialize, Serialize};

use super::principals::{Principal, Principals};

/// How long a ticket may be used.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// The environment variable that sets the key explicitly (any non-empty string, the same on
/// every server).
pub const TICKET_KEY_ENV: &str = "DAGLOOP_TICKET_KEY";

/// What a ticket says (its signed part).
#[derive(Serialize, Deserialize)]
struct Claims {
    /// The run whose events it opens.
    run: String,
    /// The principal's name.
    who: String,
    /// Until when (milliseconds since the Unix epoch).
    exp: u64,
    /// 128 random bits, as hex: what a server remembers as used.
    nonce: String,
}

/// The key, and the nonces this server redeemed (with their expiry).
pub(super) struct Tickets {
    key: hmac::Key,
    used: Mutex<BTreeMap<String, u64>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Tickets {
    /// Tickets under `DAGLOOP_TICKET_KEY` when it is set, else under the key `principals`
    /// derive.
    pub fn new(principals: &Principals) -> Tickets {
        let explicit = std::env::var(TICKET_KEY_ENV)
            .ok()
            .filter(|k| !k.trim().is_empty());
        Tickets::with_key(principals, explicit.as_deref())
    }

    fn with_key(principals: &Principals, explicit: Option<&str>) -> Tickets {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"dagloop ticket key v1\n");
        match explicit {
            Some(k) => {
                ctx.update(b"explicit\n");
                ctx.update(k.as_bytes());
            }
            None => ctx.update(&principals.fingerprint()),
        }
        Tickets {
            key: hmac::Key::new(hmac::HMAC_SHA256, ctx.finish().as_ref()),
            used: Mutex::new(BTreeMap::new()),
        }
    }

    /// A ticket for `run`'s events as `who`, valid for [`TICKET_TTL`]; None without randomness.
    pub fn issue(&self, run: &str, who: &Principal) -> Option<String> {
        let claims = Claims {
            run: run.to_string(),
            who: who.name.clone(),
            exp: now_ms().saturating_add(TICKET_TTL.as_millis() as u64),
            nonce: random_hex()?,
        };
        let body = serde_json::to_vec(&claims).ok()?;
        let tag = hmac::sign(&self.key, &body);
        Some(format!("v1.{}.{}", hex(&body), hex(tag.as_ref())))
    }

    /// The principal (as `principals` know it now) a ticket stands for, when its signature
    /// holds, it has not expired, it is bound to `run`, and this server has not redeemed it
    /// before. Redeemed, it is remembered as used until it expires.
    pub fn redeem(&self, ticket: &str, run: &str, principals: &Principals) -> Option<Principal> {
        let mut parts = ticket.split('.');
        let (Some("v1"), Some(body), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let (body, tag) = (unhex(body)?, unhex(tag)?);
        hmac::verify(&self.key, &body, &tag).ok()?;
        let claims: Claims = serde_json::from_slice(&body).ok()?;
        let now = now_ms();
        if claims.exp <= now || claims.run != run {
            return None;
        }
        let who = principals.named(&claims.who)?;
        let mut used = match self.used.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        used.retain(|_, exp| *exp > now);
        if used.insert(claims.nonce, claims.exp).is_some() {
            return None;
        }
        Some(who)
    }
}

/// 128 bits from the operating system's randomness, as hex.
fn random_hex() -> Option<String> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut b).ok()?;
    Some(hex(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::principals::{PrincipalConfig, Role, token_sha256};

    fn principals(token: &str) -> Principals {
        Principals::new(
            &[PrincipalConfig {
                name: "alice".into(),
                token_sha256: token_sha256(token),
                roles: vec![Role::Review],
            }],
            None,
        )
        .expect("valid")
    }

    #[test]
    fn a_ticket_from_one_server_opens_the_stream_on_another_once() {
        let p = principals("t");
        let (a, b) = (Tickets::with_key(&p, None), Tickets::with_key(&p, None));
        let alice = p.named("alice").expect("alice");
        let t = a.issue("run-1", &alice).expect("ticket");
        assert_eq!(b.redeem(&t, "run-2", &p), None, "another run");
        assert_eq!(
            b.redeem(&t, "run-1", &p).map(|p| p.name),
            Some("alice".into())
        );
        assert_eq!(b.redeem(&t, "run-1", &p), None, "used on this server");
        // Another deployment (another token, another explicit key) does not take it.
        let other = principals("u");
        assert_eq!(
            Tickets::with_key(&other, None).redeem(&t, "run-1", &other),
            None
        );
        let keyed = Tickets::with_key(&p, Some("k"));
        assert_eq!(keyed.redeem(&t, "run-1", &p), None);
        let t = keyed.issue("run-1", &alice).expect("ticket");
        assert!(
            Tickets::with_key(&p, Some("k"))
                .redeem(&t, "run-1", &p)
                .is_some()
        );
        // A tampered ticket is refused.
        let t = a.issue("run-1", &alice).expect("ticket");
        let mut forged = t.clone().into_bytes();
        let i = forged.len() - 1;
        forged[i] = if forged[i] == b'0' { b'1' } else { b'0' };
        let forged = String::from_utf8(forged).expect("ascii");
        assert_eq!(b.redeem(&forged, "run-1", &p), None);
        assert_eq!(b.redeem("v1.zz.00", "run-1", &p), None);
    }

    #[test]
    fn an_expired_ticket_or_a_removed_principal_is_refused() {
        let p = principals("t");
        let tickets = Tickets::with_key(&p, None);
        let claims = Claims {
            run: "run-1".into(),
            who: "alice".into(),
            exp: now_ms().saturating_sub(1),
            nonce: "00".into(),
        };
        let body = serde_json::to_vec(&claims).expect("json");
        let tag = hmac::sign(&tickets.key, &body);
        let expired = format!("v1.{}.{}", hex(&body), hex(tag.as_ref()));
        assert_eq!(tickets.redeem(&expired, "run-1", &p), None);
        let bob = Principal {
            name: "bob".into(),
            roles: vec![Role::Review],
        };
        let t = tickets.issue("run-1", &bob).expect("ticket");
        assert_eq!(tickets.redeem(&t, "run-1", &p), None, "no such principal");
    }
}
