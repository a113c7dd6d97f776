//! TLS to PostgreSQL, the way libpq's connection strings ask for it.
//!
//! - `sslmode=require`, `verify-ca` or `verify-full`: TLS with rustls, and
//!   the server's certificate is **always** verified — chain and host name —
//!   against the PEM file `sslrootcert` names, else the public web roots
//!   (`webpki-roots`). So `require` means what libpq calls `verify-full`:
//!   an encrypted connection to a server that cannot prove who it is would
//!   only move the attacker, and a lease database is where a cluster's
//!   sessions and conversations live.
//! - `sslmode=disable`, `prefer` or none: plaintext, as before TLS support
//!   (libpq's `prefer` would try TLS first; a connection that silently falls
//!   back is no protection, so ask for `require`).
//!
//! `sslrootcert` is taken out of the string before `tokio-postgres` parses
//! it (that parser knows no such option), in both the URL form
//! (`postgres://…?sslmode=require&sslrootcert=/etc/ca.pem`) and the
//! key=value form (`host=db sslmode=require sslrootcert=/etc/ca.pem`; the
//! path may not contain spaces there).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::PgError;

/// A connection string's TLS wishes, taken out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    /// The string to give `tokio-postgres`: `sslrootcert` removed,
    /// `verify-ca`/`verify-full` spelled `require`.
    pub(crate) rest: String,
    /// The CA file, if one was named.
    pub(crate) root_cert: Option<PathBuf>,
}

/// Splits the TLS options libpq knows and `tokio-postgres` does not out of
/// `url`.
pub(crate) fn split(url: &str) -> TlsOptions {
    let mut root_cert = None;
    let mut keep = |pair: &str| -> Option<String> {
        let (key, value) = pair.split_once('=')?;
        match key {
            "sslrootcert" => {
                root_cert = Some(PathBuf::from(percent_decode(value)));
                None
            }
            "sslmode" if matches!(value, "verify-ca" | "verify-full") => {
                Some("sslmode=require".to_owned())
            }
            _ => Some(pair.to_owned()),
        }
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<String> = query
                    .split('&')
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| keep(p).or_else(|| (!p.contains('=')).then(|| p.to_owned())))
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        url.split_whitespace()
            .filter_map(|p| keep(p).or_else(|| (!p.contains('=')).then(|| p.to_owned())))
            .collect::<Vec<_>>()
            .join(" ")
    };
    TlsOptions { rest, root_cert }
}

/// `%XX` escapes decoded (a URL's query value); anything malformed is kept
/// as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let v = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector for `config`: rustls verifying against `root_cert` (else
/// the web roots) when the configuration requires TLS; otherwise TLS is
/// switched off in `config` and the connector is never used.
pub(crate) fn connector(
    config: &mut tokio_postgres::Config,
    root_cert: Option<&Path>,
) -> Result<MakeRustlsConnect, PgError> {
    let mut roots = rustls::RootCertStore::empty();
    match (config.get_ssl_mode(), root_cert) {
        (SslMode::Require, Some(path)) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| PgError::Tls(format!("sslrootcert {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(PgError::Tls(format!(
                    "sslrootcert {}: no PEM certificate in it",
                    path.display()
                )));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| PgError::Tls(format!("sslrootcert {}: {e}", path.display())))?;
            }
        }
        (SslMode::Require, None) => {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        _ => {
            config.ssl_mode(SslMode::Disable);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PgError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslrootcert_is_taken_out_of_both_forms_and_verify_modes_mean_require() {
        let url = split(
            "postgres://u:p@db:5432/w?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem&application_name=a",
        );
        assert_eq!(
            url.rest,
            "postgres://u:p@db:5432/w?sslmode=require&application_name=a"
        );
        assert_eq!(url.root_cert, Some(PathBuf::from("/etc/ca x.pem")));
        let kv = split("host=db sslmode=require sslrootcert=/etc/ca.pem user=u");
        assert_eq!(kv.rest, "host=db sslmode=require user=u");
        assert_eq!(kv.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let only = split("postgres://db/w?sslrootcert=/ca.pem");
        assert_eq!(only.rest, "postgres://db/w");
        let plain = split("postgres://db/w");
        assert_eq!(
            (plain.rest.as_str(), plain.root_cert),
            ("postgres://db/w", None)
        );
    }

    #[test]
    fn without_require_tls_is_off_and_a_bad_ca_file_is_a_typed_error() {
        let mut config: tokio_postgres::Config = "postgres://db/w".parse().expect("parses");
        connector(&mut config, None).expect("a connector");
        assert_eq!(config.get_ssl_mode(), SslMode::Disable);
        let mut config: tokio_postgres::Config =
            "postgres://db/w?sslmode=require".parse().expect("parses");
        let Err(err) = connector(&mut config, Some(Path::new("/nonexistent/ca.pem"))) else {
            panic!("a CA file that does not exist is an error");
        };
        assert!(
            matches!(err, PgError::Tls(ref m) if m.contains("/nonexistent/ca.pem")),
            "{err}"
        );
        connector(&mut config, None).expect("the web roots");
        assert_eq!(config.get_ssl_mode(), SslMode::Require);
    }
}
