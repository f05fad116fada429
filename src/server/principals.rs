//! Who calls the API: bearer tokens mapped to named principals with roles, as the operator
//! configures them ([`PrincipalConfig`], tokens stored only as the SHA-256 of the token).
//!
//! Roles: `submit` creates runs and sees and cancels only the runs it created; `review` lists
//! and reads every run and decides calls; `metrics` reads `GET /metrics` only; `admin` does
//! everything. The old single
//! `DAGLOOP_TOKEN` is one principal `admin` with the admin role; a server with no token at all
//! (only allowed on loopback) treats every caller as the principal `local` with every role.
//!
//! Deliberately not here: reading a configuration file (the operator's config does that and
//! hands [`PrincipalConfig`]s to [`super::ServeOptions`]), or deciding which route needs which
//! role (the handlers in `api` and `auth` do, through [`Principal::may`]).

use serde::{Deserialize, Serialize};

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Create runs; see and cancel the runs it created.
    Submit,
    /// List and read every run; decide calls awaiting approval.
    Review,
    /// Everything.
    Admin,
    /// Read `GET /metrics` (and nothing else): for a scraper the operator configures. Besides
    /// it, only `admin` reads the metrics, which count every principal's runs.
    Metrics,
}

/// One principal as the operator configures it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// The name decisions, cancellations and runs are recorded with.
    pub name: String,
    /// The lowercase hex SHA-256 of the principal's bearer token (see [`token_sha256`]).
    pub token_sha256: String,
    /// What it may do.
    pub roles: Vec<Role>,
}

/// Why the principals cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrincipalError {
    /// A principal has an empty name, or a name the server reserves.
    #[error("principal name `{name}` is empty or reserved (`local` is the no-token principal)")]
    BadName {
        /// The name.
        name: String,
    },
    /// Two principals share a name.
    #[error("two principals are named `{name}`")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// `token_sha256` is not 64 lowercase hex digits.
    #[error(
        "principal `{name}`: token_sha256 must be 64 lowercase hex digits (the SHA-256 of the token)"
    )]
    BadHash {
        /// The principal.
        name: String,
    },
    /// Two principals have the same token.
    #[error("principals `{first}` and `{second}` have the same token")]
    DuplicateToken {
        /// The first one.
        first: String,
        /// The second one.
        second: String,
    },
    /// A principal has no role.
    #[error("principal `{name}` has no role (submit, review, admin)")]
    NoRole {
        /// The principal.
        name: String,
    },
}

crate::codes::has_code!(PrincipalError);

impl PrincipalError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            PrincipalError::BadName { .. } => "server.principal_name",
            PrincipalError::DuplicateName { .. } => "server.principal_duplicate",
            PrincipalError::BadHash { .. } => "server.principal_hash",
            PrincipalError::DuplicateToken { .. } => "server.principal_duplicate_token",
            PrincipalError::NoRole { .. } => "server.principal_roles",
        }
    }
}

/// The lowercase hex SHA-256 of a token: what [`PrincipalConfig::token_sha256`] holds.
pub fn token_sha256(token: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The name of the principal every caller is when the server has no token.
pub const LOCAL: &str = "local";

/// The name the single `DAGLOOP_TOKEN` stands for.
pub const LEGACY_ADMIN: &str = "admin";

/// An identified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Its name.
    pub name: String,
    /// Its roles.
    pub roles: Vec<Role>,
}

impl Principal {
    /// The caller of a server without tokens: every role.
    pub fn local() -> Principal {
        Principal {
            name: LOCAL.into(),
            roles: vec![Role::Submit, Role::Review, Role::Admin],
        }
    }

    /// Whether it holds `role` (admin holds every role).
    pub fn may(&self, role: Role) -> bool {
        self.roles.contains(&role) || self.roles.contains(&Role::Admin)
    }

    /// Whether it may read (and follow) a run submitted by `owner`: reviewers and admins read
    /// every run, a submitter only its own.
    pub fn may_read(&self, owner: Option<&str>) -> bool {
        self.may(Role::Review) || self.owns(owner)
    }

    /// Whether it may cancel a run submitted by `owner`: admins cancel every run, a submitter
    /// its own.
    pub fn may_cancel(&self, owner: Option<&str>) -> bool {
        self.roles.contains(&Role::Admin) || self.owns(owner)
    }

    fn owns(&self, owner: Option<&str>) -> bool {
        self.roles.contains(&Role::Submit) && owner == Some(self.name.as_str())
    }
}

/// The principals a server knows, by token hash.
#[derive(Debug, Clone, Default)]
pub(super) struct Principals {
    known: Vec<(Principal, [u8; 32])>,
}

impl Principals {
    /// The configured principals, plus `admin` for the single legacy token when there is one.
    pub fn new(
        configs: &[PrincipalConfig],
        legacy_token: Option<&str>,
    ) -> Result<Principals, PrincipalError> {
        let mut known: Vec<(Principal, [u8; 32])> = Vec::new();
        let mut add = |p: Principal, hash: [u8; 32]| -> Result<(), PrincipalError> {
            if let Some((other, _)) = known.iter().find(|(o, _)| o.name == p.name) {
                return Err(PrincipalError::DuplicateName {
                    name: other.name.clone(),
                });
            }
            if let Some((other, _)) = known.iter().find(|(_, h)| same(h, &hash)) {
                return Err(PrincipalError::DuplicateToken {
                    first: other.name.clone(),
                    second: p.name,
                });
            }
            known.push((p, hash));
            Ok(())
        };
        for c in configs {
            if c.name.trim().is_empty() || c.name == LOCAL {
                return Err(PrincipalError::BadName {
                    name: c.name.clone(),
                });
            }
            if c.roles.is_empty() {
                return Err(PrincipalError::NoRole {
                    name: c.name.clone(),
                });
            }
            let hash = parse_hash(&c.token_sha256).ok_or_else(|| PrincipalError::BadHash {
                name: c.name.clone(),
            })?;
            add(
                Principal {
                    name: c.name.clone(),
                    roles: c.roles.clone(),
                },
                hash,
            )?;
        }
        if let Some(t) = legacy_token {
            add(
                Principal {
                    name: LEGACY_ADMIN.into(),
                    roles: vec![Role::Admin],
                },
                digest(t),
            )?;
        }
        Ok(Principals { known })
    }

    /// No token is configured: every caller is [`Principal::local`].
    pub fn open(&self) -> bool {
        self.known.is_empty()
    }

    /// The principal this token belongs to. Every known hash is compared, each in constant
    /// time, so the time taken says nothing about which one (or how much of one) matched.
    pub fn identify(&self, token: &str) -> Option<Principal> {
        let h = digest(token);
        let mut found = None;
        for (p, known) in &self.known {
            if same(known, &h) && found.is_none() {
                found = Some(p.clone());
            }
        }
        found
    }

    /// The principal with this name, with its roles as configured now.
    pub fn named(&self, name: &str) -> Option<Principal> {
        self.known
            .iter()
            .find(|(p, _)| p.name == name)
            .map(|(p, _)| p.clone())
    }

    /// The known principals (names, roles, token hashes) as bytes, in name order: what
    /// servers sharing them derive their ticket key from (`tickets`).
    pub fn fingerprint(&self) -> Vec<u8> {
        let mut known: Vec<&(Principal, [u8; 32])> = self.known.iter().collect();
        known.sort_by(|x, y| x.0.name.cmp(&y.0.name));
        let mut out = Vec::new();
        for (p, hash) in known {
            out.extend_from_slice(p.name.as_bytes());
            out.push(0);
            for r in &p.roles {
                out.extend_from_slice(format!("{r:?}").as_bytes());
                out.push(b',');
            }
            out.push(0);
            out.extend_from_slice(hash);
            out.push(b'\n');
        }
        out
    }
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
    }
    Some(out)
}

/// Equal, in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str, token: &str, roles: &[Role]) -> PrincipalConfig {
        PrincipalConfig {
            name: name.into(),
            token_sha256: token_sha256(token),
            roles: roles.to_vec(),
        }
    }

    #[test]
    fn tokens_map_to_their_principals_and_the_legacy_token_is_admin() {
        let p = Principals::new(
            &[
                cfg("ci", "t-ci", &[Role::Submit]),
                cfg("alice", "t-alice", &[Role::Review]),
            ],
            Some("legacy"),
        )
        .expect("valid");
        assert!(!p.open());
        assert_eq!(p.identify("t-ci").map(|p| p.name), Some("ci".into()));
        assert_eq!(p.identify("t-alice").map(|p| p.name), Some("alice".into()));
        let admin = p.identify("legacy").expect("legacy token");
        assert_eq!(admin.name, "admin");
        assert!(admin.may(Role::Submit) && admin.may(Role::Review));
        assert_eq!(p.identify("t-ci "), None);
        assert_eq!(p.identify(""), None);
        assert!(Principals::new(&[], None).expect("empty").open());
    }

    #[test]
    fn roles_decide_what_a_principal_may_read_and_cancel() {
        let sub = Principal {
            name: "ci".into(),
            roles: vec![Role::Submit],
        };
        let rev = Principal {
            name: "alice".into(),
            roles: vec![Role::Review],
        };
        assert!(sub.may_read(Some("ci")) && sub.may_cancel(Some("ci")));
        assert!(!sub.may_read(Some("other")) && !sub.may_cancel(Some("other")));
        assert!(!sub.may_read(None) && !sub.may(Role::Review));
        assert!(rev.may_read(Some("ci")) && rev.may_read(None));
        assert!(!rev.may_cancel(Some("ci")) && !rev.may(Role::Submit));
        assert!(Principal::local().may_cancel(None));
    }

    #[test]
    fn bad_configurations_are_refused_with_codes() {
        let mut bad = cfg("x", "t", &[Role::Admin]);
        bad.token_sha256 = token_sha256("t").to_uppercase();
        let e = Principals::new(&[bad], None).expect_err("uppercase hex");
        assert_eq!(e.code(), "server.principal_hash");
        let e = Principals::new(&[cfg("local", "t", &[Role::Admin])], None).expect_err("reserved");
        assert_eq!(e.code(), "server.principal_name");
        let e = Principals::new(&[cfg("a", "t", &[]), cfg("b", "u", &[Role::Admin])], None)
            .expect_err("no role");
        assert_eq!(e.code(), "server.principal_roles");
        let e = Principals::new(
            &[cfg("a", "t", &[Role::Admin]), cfg("b", "t", &[Role::Admin])],
            None,
        )
        .expect_err("same token");
        assert_eq!(e.code(), "server.principal_duplicate_token");
        let e = Principals::new(&[cfg("admin", "t", &[Role::Admin])], Some("u"))
            .expect_err("the legacy admin clashes");
        assert_eq!(e.code(), "server.principal_duplicate");
    }

    #[test]
    fn configs_deny_unknown_fields_and_hash_like_sha256sum() {
        let v = serde_json::json!({"name": "a", "token_sha256": "00", "roles": ["review"], "x": 1});
        assert!(serde_json::from_value::<PrincipalConfig>(v).is_err());
        let v =
            serde_json::json!({"name": "a", "token_sha256": "00", "roles": ["review", "admin"]});
        let c: PrincipalConfig = serde_json::from_value(v).expect("valid");
        assert_eq!(c.roles, [Role::Review, Role::Admin]);
        // `printf abc | sha256sum`
        assert_eq!(
            token_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
