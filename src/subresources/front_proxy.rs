//! Who is asking: kube-apiserver, as the front proxy, authenticates the caller and names them
//! in request headers. Those headers are believed only from a connection whose client
//! certificate the front-proxy CA signed, with a common name the API server allows; the CA,
//! the names and the headers are the ones kube-apiserver publishes in the ConfigMap
//! `kube-system/extension-apiserver-authentication`.

use std::collections::BTreeMap;

use http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

/// Where kube-apiserver publishes how it proxies (namespace, name).
pub const AUTHENTICATION_CONFIG_MAP: (&str, &str) =
    ("kube-system", "extension-apiserver-authentication");

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading kube-system/extension-apiserver-authentication: {0}")]
    Read(#[from] kube::Error),
    #[error(
        "kube-system/extension-apiserver-authentication has no {0}: kube-apiserver was started \
         without the front-proxy flags (--requestheader-*)"
    )]
    Missing(&'static str),
    #[error(
        "{key} in kube-system/extension-apiserver-authentication is not a JSON list of strings: \
         {source}"
    )]
    NotAList {
        key: &'static str,
        source: serde_json::Error,
    },
}

/// How kube-apiserver proxies to aggregated API servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontProxy {
    /// The CA that signs the front proxy's client certificate (PEM).
    pub ca_pem: String,
    /// The common names the front proxy's certificate may have; empty: any the CA signed.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefixes: Vec<String>,
}

/// The caller kube-apiserver authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is not believed to come through the front proxy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    #[error("the client certificate's common name {0:?} is not one the front proxy may have")]
    NameNotAllowed(String),
    #[error("the request names no user")]
    NoUser,
}

impl FrontProxy {
    /// Reads it from `kube-system/extension-apiserver-authentication`.
    pub async fn from_cluster(client: Client) -> Result<Self, Error> {
        let (namespace, name) = AUTHENTICATION_CONFIG_MAP;
        let config = Api::<ConfigMap>::namespaced(client, namespace)
            .get(name)
            .await?;
        Self::from_data(&config.data.unwrap_or_default())
    }

    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, Error> {
        let ca_pem = data
            .get("requestheader-client-ca-file")
            .filter(|pem| !pem.trim().is_empty())
            .ok_or(Error::Missing("requestheader-client-ca-file"))?
            .clone();
        let list = |key: &'static str| -> Result<Vec<String>, Error> {
            match data.get(key) {
                None => Ok(Vec::new()),
                Some(text) => {
                    serde_json::from_str(text).map_err(|source| Error::NotAList { key, source })
                }
            }
        };
        let username_headers = list("requestheader-username-headers")?;
        if username_headers.is_empty() {
            return Err(Error::Missing("requestheader-username-headers"));
        }
        Ok(FrontProxy {
            ca_pem,
            allowed_names: list("requestheader-allowed-names")?,
            username_headers,
            group_headers: list("requestheader-group-headers")?,
            extra_headers_prefixes: list("requestheader-extra-headers-prefix")?,
        })
    }

    /// The caller a request over a connection whose (verified) client certificate has
    /// `common_name` names in its headers.
    pub fn user(&self, common_name: &str, headers: &HeaderMap) -> Result<User, Unauthenticated> {
        if !self.allowed_names.is_empty() && !self.allowed_names.iter().any(|n| n == common_name) {
            return Err(Unauthenticated::NameNotAllowed(common_name.to_owned()));
        }
        let values = |name: &str| -> Vec<String> {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_owned)
                .collect()
        };
        let name = self
            .username_headers
            .iter()
            .find_map(|header| values(header).into_iter().find(|v| !v.is_empty()))
            .ok_or(Unauthenticated::NoUser)?;
        let groups = self.group_headers.iter().flat_map(|h| values(h)).collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let header = header.as_str();
            let key = self.extra_headers_prefixes.iter().find_map(|prefix| {
                let prefix = prefix.to_ascii_lowercase();
                header.strip_prefix(prefix.as_str())
            });
            if let (Some(key), Ok(value)) = (key, value.to_str()) {
                extra
                    .entry(
                        // The front proxy percent-encodes an extra's key in the header name.
                        percent_encoding::percent_decode_str(key)
                            .decode_utf8_lossy()
                            .to_ascii_lowercase(),
                    )
                    .or_default()
                    .push(value.to_owned());
            }
        }
        Ok(User {
            name,
            groups,
            extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published() -> BTreeMap<String, String> {
        [
            (
                "requestheader-client-ca-file",
                "-----BEGIN CERTIFICATE-----\n",
            ),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn the_user_groups_and_extras_come_from_the_published_headers() {
        let proxy = FrontProxy::from_data(&published()).unwrap();
        let user = proxy
            .user(
                "front-proxy-client",
                &headers(&[
                    ("x-remote-user", "alice"),
                    ("x-remote-group", "dev"),
                    ("x-remote-group", "system:authenticated"),
                    ("x-remote-extra-scopes", "a"),
                    ("x-remote-extra-acme.com%2fproject", "p1"),
                ]),
            )
            .unwrap();
        assert_eq!(
            user,
            User {
                name: "alice".into(),
                groups: vec!["dev".into(), "system:authenticated".into()],
                extra: BTreeMap::from([
                    ("acme.com/project".into(), vec!["p1".into()]),
                    ("scopes".into(), vec!["a".into()]),
                ]),
            }
        );
    }

    #[test]
    fn a_certificate_of_the_front_proxy_ca_with_another_name_is_not_believed() {
        let proxy = FrontProxy::from_data(&published()).unwrap();
        let forged = headers(&[("x-remote-user", "system:admin")]);
        assert_eq!(
            proxy.user("someone-else", &forged),
            Err(Unauthenticated::NameNotAllowed("someone-else".into()))
        );
        assert_eq!(
            proxy.user("front-proxy-client", &HeaderMap::new()),
            Err(Unauthenticated::NoUser)
        );
    }

    #[test]
    fn an_api_server_without_front_proxy_flags_is_said_so() {
        let mut data = published();
        data.remove("requestheader-client-ca-file");
        let error = FrontProxy::from_data(&data).unwrap_err().to_string();
        assert!(error.contains("--requestheader-*"), "{error}");
    }
}
