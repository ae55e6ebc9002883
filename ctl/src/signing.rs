//! `signing-key`: the key pair the api signs task specs with and the workers
//! verify them by (`shared::spec`). Needs no Redis: the keys live in the
//! binaries' configuration, never in Redis.

use shared::spec::{KeyError, SpecSigner};

#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    #[error("could not read OS randomness for a new key: {0}")]
    Random(String),
    #[error("could not read the signing key from stdin: {0}")]
    Stdin(#[from] std::io::Error),
    #[error("the TASK_SIGNING_KEY on stdin does not read: {0}")]
    Key(#[from] KeyError),
}

/// A new key pair from the OS's randomness.
pub fn generate() -> Result<SpecSigner, SigningKeyError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| SigningKeyError::Random(e.to_string()))?;
    let signer = SpecSigner::from_seed(&seed);
    seed.fill(0);
    Ok(signer)
}

/// The signer whose `TASK_SIGNING_KEY` is `text` (a line read from stdin;
/// `TASK_SIGNING_KEY=` before it is allowed, as a line of `.env` has it).
pub fn from_line(text: &str) -> Result<SpecSigner, SigningKeyError> {
    let value = text.trim();
    let value = value.strip_prefix("TASK_SIGNING_KEY=").unwrap_or(value);
    Ok(SpecSigner::from_base64(value)?)
}

/// `generate`'s text: the two lines to put in the api's and the workers'
/// environment.
pub fn render_pair(signer: &SpecSigner) -> String {
    format!(
        "# key id {id}\n\
         # the api's, secret (keep it like SCRIPT_RUNNER_TOKEN):\n\
         TASK_SIGNING_KEY={seed}\n\
         # every worker's, public (during a rotation: the old and the new key, comma-separated):\n\
         TASK_VERIFY_KEYS={public}\n",
        id = signer.key_id(),
        seed = signer.seed_base64(),
        public = signer.public_base64(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_pair_reads_back_from_its_env_line() {
        let signer = generate().unwrap();
        let text = render_pair(&signer);
        let line = text
            .lines()
            .find(|l| l.starts_with("TASK_SIGNING_KEY="))
            .unwrap();
        let again = from_line(line).unwrap();
        assert_eq!(again.key_id(), signer.key_id());
        assert!(text.contains(&format!("TASK_VERIFY_KEYS={}\n", signer.public_base64())));
        assert_ne!(generate().unwrap().key_id(), signer.key_id());
        assert!(from_line("TASK_SIGNING_KEY=short").is_err());
    }
}
