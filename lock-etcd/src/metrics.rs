//! The server's own request counter, read from a member's `/metrics` (Prometheus text) over a
//! plain HTTP/1.0 request (TLS for `etcds://`, verified with the URL's CA).

use std::sync::Arc;

use lockcore::{Error, ErrorKind, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::Config;

/// The counter summed: one per unary request and per message received on a stream.
const COUNTER: &str = "grpc_server_msg_received_total";

/// The sum of [`COUNTER`] over every method, from the first listed member.
pub(crate) async fn requests(config: &Config) -> Result<u64> {
    let host = config.hosts[0].clone();
    let fut = async {
        let tcp = TcpStream::connect(&host)
            .await
            .map_err(|e| Error::unavailable(format!("connecting to {host} for /metrics"), e))?;
        if config.tls {
            let connector = tls_connector(config)?;
            let name = server_name(config, &host)?;
            let tls = connector
                .connect(name, tcp)
                .await
                .map_err(|e| Error::unavailable(format!("TLS to {host} for /metrics"), e))?;
            fetch(tls, &host).await
        } else {
            fetch(tcp, &host).await
        }
    };
    let body = tokio::time::timeout(config.timeout, fut)
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Unavailable,
                format!("no /metrics answer from {host} within {:?}", config.timeout),
            )
        })??;
    let mut total = 0f64;
    let mut found = false;
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix(COUNTER)
            && (rest.starts_with('{') || rest.starts_with(' '))
            && let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())
        {
            total += v;
            found = true;
        }
    }
    if !found {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("{host}/metrics has no {COUNTER}"),
        ));
    }
    Ok(total as u64)
}

async fn fetch<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, host: &str) -> Result<String> {
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| Error::unavailable("sending the /metrics request", e))?;
    let mut buf = Vec::new();
    // A TLS peer may close without close_notify; what was read is complete for HTTP/1.0.
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::new(ErrorKind::Unavailable, "a truncated /metrics answer"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(Error::new(
            ErrorKind::Backend,
            format!(
                "/metrics answered {}",
                head.lines().next().unwrap_or_default()
            ),
        ));
    }
    Ok(body.to_owned())
}

fn tls_connector(config: &Config) -> Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let ca = config.ca.as_ref().ok_or_else(|| {
        Error::unsupported("reading /metrics over TLS needs the URL's ca= certificate")
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)
        .map_err(|e| Error::invalid_config(format!("reading {}", ca.display())).with_source(e))?
    {
        let cert = cert.map_err(|e| {
            Error::invalid_config(format!("reading {}", ca.display())).with_source(e)
        })?;
        roots.add(cert).map_err(|e| {
            Error::invalid_config(format!("a CA in {}", ca.display())).with_source(e)
        })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::backend("TLS setup", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}

fn server_name(config: &Config, host: &str) -> Result<rustls::pki_types::ServerName<'static>> {
    let name = match &config.domain {
        Some(d) => d.clone(),
        None => {
            let h = host.rsplit_once(':').map_or(host, |(h, _)| h);
            h.trim_start_matches('[').trim_end_matches(']').to_owned()
        }
    };
    rustls::pki_types::ServerName::try_from(name)
        .map_err(|e| Error::invalid_config("the TLS server name").with_source(e))
}
