use k8s_openapi::ByteString;

use super::*;
use crate::crd::{ClaimEnvSource, ClaimSecretKeyRef};

fn plain(name: &str, value: &str) -> ClaimEnvVar {
    ClaimEnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn from_secret(name: &str, secret: &str, key: &str) -> ClaimEnvVar {
    ClaimEnvVar {
        name: name.into(),
        value: None,
        value_from: Some(ClaimEnvSource {
            secret_key_ref: ClaimSecretKeyRef {
                name: secret.into(),
                key: key.into(),
            },
        }),
    }
}

fn secret(labelled: bool, data: &[(&str, &[u8])]) -> Option<Secret> {
    let mut secret = Secret::default();
    if labelled {
        secret.metadata.labels = Some(BTreeMap::from([(
            CLAIM_ENV_LABEL.to_owned(),
            CLAIM_ENV_LABEL_VALUE.to_owned(),
        )]));
    }
    secret.data = Some(
        data.iter()
            .map(|(key, value)| (key.to_string(), ByteString(value.to_vec())))
            .collect(),
    );
    Some(secret)
}

#[test]
fn a_claimers_environment_takes_values_and_labelled_secret_keys_and_nothing_else() {
    let token: &[u8] = b"tok-123";
    let secrets = BTreeMap::from([
        (
            "tools".to_owned(),
            secret(true, &[("token", token), ("bin", &[0xff, 0xfe])]),
        ),
        ("nul".to_owned(), secret(true, &[("v", b"a\0b")])),
        ("unlabelled".to_owned(), secret(false, &[("token", token)])),
        ("gone".to_owned(), None),
    ]);
    let env = |pairs: &[(&str, &str)]| -> Result<ClaimEnv, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    };
    let no_label = "no Secret ns/unlabelled labelled briq.cloud/claim-env=true (for T)";
    let cases: Vec<(&str, Vec<ClaimEnvVar>, Result<ClaimEnv, String>)> = vec![
        ("nothing asked", vec![], env(&[])),
        (
            "values and a labelled Secret's key",
            vec![plain("REGION", "eu"), from_secret("T", "tools", "token")],
            env(&[("REGION", "eu"), ("T", "tok-123")]),
        ),
        (
            // The confused deputy: a Secret the claimer's author may not be able to read.
            "an unlabelled Secret is missing",
            vec![from_secret("T", "unlabelled", "token")],
            Err(no_label.into()),
        ),
        (
            "a missing Secret",
            vec![from_secret("T", "gone", "token")],
            Err("no Secret ns/gone labelled briq.cloud/claim-env=true (for T)".into()),
        ),
        (
            "a missing key",
            vec![from_secret("T", "tools", "other")],
            Err("Secret ns/tools has no key other (for T)".into()),
        ),
        (
            "a key that is not text",
            vec![from_secret("B", "tools", "bin")],
            Err("key bin of Secret ns/tools is not UTF-8 text (for B)".into()),
        ),
        (
            "a NUL cannot be in an environment",
            vec![from_secret("N", "nul", "v")],
            Err("the value of N contains NUL".into()),
        ),
        (
            "neither value nor valueFrom",
            vec![ClaimEnvVar {
                name: "E".into(),
                value: None,
                value_from: None,
            }],
            Err("E needs exactly one of value and valueFrom".into()),
        ),
        (
            "too heavy as a whole",
            vec![
                plain("A", &"x".repeat(32_768)),
                plain("B", &"y".repeat(32_768)),
            ],
            Err("the environment is 65551 bytes, over the limit of 65536".into()),
        ),
    ];
    for (name, entries, expected) in cases {
        assert_eq!(resolve("ns", &entries, &secrets), expected, "{name}");
    }
}

#[test]
fn each_secret_named_is_read_once() {
    let entries = [
        from_secret("A", "tools", "a"),
        plain("P", "p"),
        from_secret("B", "tools", "b"),
        from_secret("C", "other", "c"),
    ];
    assert_eq!(secrets_named(&entries), ["other", "tools"]);
}
