//! The aggregated API's serving certificate, read again when its files change: cert-manager
//! renews it (and the kubelet rewrites the Secret's files) long before it expires, and a
//! server that kept the one it read at start would fail every caller once that one expired.
//! A changed pair that does not load (a key not yet rewritten beside its new certificate, a
//! truncated file) keeps the previous one until the next look.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

/// Where the certificate and its key are read again, and how often they are looked at.
#[derive(Debug, Clone)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub every: Duration,
}

/// A certificate chain and its key, as PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

impl Pem {
    pub fn read(files: &CertificateFiles) -> std::io::Result<Pem> {
        Ok(Pem {
            cert: std::fs::read_to_string(&files.cert)?,
            key: std::fs::read_to_string(&files.key)?,
        })
    }

    /// The pair, loaded and checked: the key must be the certificate's.
    pub fn certified(&self, provider: &CryptoProvider) -> Result<CertifiedKey, String> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("the certificate: {e}"))?;
        if chain.is_empty() {
            return Err("the certificate file holds no certificate".into());
        }
        let key = PrivateKeyDer::from_pem_slice(self.key.as_bytes())
            .map_err(|e| format!("the key: {e}"))?;
        CertifiedKey::from_der(chain, key, provider).map_err(|e| e.to_string())
    }
}

/// The certificate every new connection is served, replaced when its files change.
#[derive(Debug)]
pub struct ServingCertificate {
    current: RwLock<(Pem, Arc<CertifiedKey>)>,
    provider: Arc<CryptoProvider>,
}

impl ServingCertificate {
    pub fn new(pem: Pem, provider: Arc<CryptoProvider>) -> Result<ServingCertificate, String> {
        let key = Arc::new(pem.certified(&provider)?);
        Ok(ServingCertificate {
            current: RwLock::new((pem, key)),
            provider,
        })
    }

    /// Serves `pem` from now on, if it differs from the current pair and loads; true when it
    /// replaced it.
    pub fn offer(&self, pem: Pem) -> Result<bool, String> {
        if self.current.read().expect("certificate lock").0 == pem {
            return Ok(false);
        }
        let key = Arc::new(pem.certified(&self.provider)?);
        *self.current.write().expect("certificate lock") = (pem, key);
        Ok(true)
    }

    /// Looks at `files` every `files.every`, forever.
    pub async fn follow(self: Arc<Self>, files: CertificateFiles) {
        let mut warned = None;
        loop {
            tokio::time::sleep(files.every).await;
            let offered = Pem::read(&files)
                .map_err(|e| e.to_string())
                .and_then(|pem| self.offer(pem));
            match offered {
                Ok(true) => {
                    tracing::info!(cert = %files.cert.display(), "the aggregated API serves its renewed certificate");
                    warned = None;
                }
                Ok(false) => warned = None,
                Err(why) if warned.as_ref() != Some(&why) => {
                    tracing::warn!(cert = %files.cert.display(), %why, "the serving certificate's files do not load; the previous certificate is kept");
                    warned = Some(why);
                }
                Err(_) => {}
            }
        }
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("certificate lock").1.clone())
    }
}
