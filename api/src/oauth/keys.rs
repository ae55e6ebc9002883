//! The issuer's signing keys as the validator caches them (`KeyCache`), which
//! of a JWK set's keys are usable (`usable_key`), and the pacing of fetches
//! (`FetchState`).

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use url::Url;

use super::REFETCH_GAP;

#[derive(Default)]
pub(super) struct KeyCache {
    pub(super) keys: Vec<CachedKey>,
    pub(super) fetched_at: Option<Instant>,
    /// Why the last fetch failed (`None` after one succeeded).
    pub(super) last_error: Option<String>,
}

pub(super) struct CachedKey {
    kid: Option<String>,
    /// The JWK's `alg`, if it names one: the only algorithm it may verify.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

#[derive(Default)]
pub(super) struct FetchState {
    pub(super) jwks_uri: Option<Url>,
    last_attempt: Option<Instant>,
}

impl FetchState {
    /// True (and the attempt counted) unless one was made within `REFETCH_GAP`.
    pub(super) fn start_attempt(&mut self) -> bool {
        let due = self.last_attempt.is_none_or(|t| t.elapsed() >= REFETCH_GAP);
        if due {
            self.last_attempt = Some(Instant::now());
        }
        due
    }
}

impl KeyCache {
    pub(super) fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let usable =
            |k: &&CachedKey| k.key.family() == alg.family() && k.alg.is_none_or(|a| a == alg);
        match kid {
            Some(kid) => self
                .keys
                .iter()
                .filter(usable)
                .find(|k| k.kid.as_deref() == Some(kid))
                .map(|k| k.key.clone()),
            // No key id: only unambiguous when one key could have signed it.
            None => {
                let mut candidates = self.keys.iter().filter(usable);
                match (candidates.next(), candidates.next()) {
                    (Some(k), None) => Some(k.key.clone()),
                    _ => None,
                }
            }
        }
    }

    pub(super) fn is_fresh(&self, max_age: Duration) -> bool {
        self.fetched_at.is_some_and(|t| t.elapsed() < max_age)
    }
}

/// A signing key from the JWKS, or `None` for one this api must not or cannot use.
pub(super) fn usable_key(jwk: &Jwk) -> Option<CachedKey> {
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        Some(a) => Some(a.to_string().parse::<Algorithm>().ok()?),
        None => None,
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(CachedKey {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An RSA public key (2048 bits) as a JWK, with `extra` members merged in.
    pub(in crate::oauth) fn rsa_jwk(extra: serde_json::Value) -> Jwk {
        let mut v = serde_json::json!({
            "kty": "RSA",
            "e": "AQAB",
            "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw"
        });
        if let (Some(obj), serde_json::Value::Object(more)) = (v.as_object_mut(), extra) {
            obj.extend(more);
        }
        serde_json::from_value(v).expect("a JWK")
    }

    #[test]
    fn only_signing_keys_of_a_usable_kind_are_kept() {
        let signing = usable_key(&rsa_jwk(
            serde_json::json!({"kid": "a", "alg": "RS256", "use": "sig"}),
        ));
        assert!(
            signing
                .is_some_and(|k| k.kid.as_deref() == Some("a") && k.alg == Some(Algorithm::RS256))
        );
        assert!(usable_key(&rsa_jwk(serde_json::json!({"kid": "e", "use": "enc"}))).is_none());
        // A symmetric key in a JWKS is never used: whoever reads the JWKS could sign.
        let oct: Jwk =
            serde_json::from_value(serde_json::json!({"kty": "oct", "k": "c2VjcmV0", "kid": "h"}))
                .expect("an oct JWK");
        assert!(usable_key(&oct).is_none());
    }

    #[test]
    fn a_key_verifies_only_its_own_kid_family_and_algorithm() {
        let key = |extra| usable_key(&rsa_jwk(extra)).expect("usable");
        let cache = KeyCache {
            keys: vec![
                key(serde_json::json!({"kid": "a", "alg": "RS256"})),
                key(serde_json::json!({"kid": "b"})),
            ],
            fetched_at: Some(Instant::now()),
            last_error: None,
        };
        assert!(cache.find(Some("a"), Algorithm::RS256).is_some());
        assert!(
            cache.find(Some("a"), Algorithm::PS256).is_none(),
            "the JWK says RS256"
        );
        assert!(
            cache.find(Some("b"), Algorithm::PS256).is_some(),
            "no alg: any RSA one"
        );
        assert!(
            cache.find(Some("b"), Algorithm::ES256).is_none(),
            "an RSA key is no EC key"
        );
        assert!(cache.find(Some("c"), Algorithm::RS256).is_none());
        // Without a kid only an unambiguous key will do: two RSA keys are not.
        assert!(cache.find(None, Algorithm::RS256).is_none());
        let one = KeyCache {
            keys: vec![key(serde_json::json!({}))],
            fetched_at: None,
            last_error: None,
        };
        assert!(one.find(None, Algorithm::RS256).is_some());
        assert!(!one.is_fresh(Duration::from_secs(60)));
    }
}
