//! A certificate authority of the test process's own, and certificates it signs for a peer's
//! names: what lets the suites speak real TLS to peers on the private networks. Nothing of it is
//! added to any image's trust store; a client that verifies is handed the CA's file.

use std::path::PathBuf;
use std::sync::OnceLock;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

struct TestCa {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca() -> &'static TestCa {
    static CA: OnceLock<TestCa> = OnceLock::new();
    CA.get_or_init(|| {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("parameters");
        params.distinguished_name.push(DnType::CommonName, "agent-sandbox test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).expect("the CA certificate").pem();
        TestCa { pem, issuer: Issuer::new(params, key) }
    })
}

/// The CA's certificate as a PEM file (written once per test process).
pub fn ca_file() -> anyhow::Result<PathBuf> {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    if let Some(path) = FILE.get() {
        return Ok(path.clone());
    }
    let dir = crate::root().join("target/agent-sandbox/test-ca");
    std::fs::create_dir_all(&dir)?;
    // Each test process has its own CA: the files of processes that have ended go.
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_suffix(".pem")
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let path = dir.join(format!("{}.pem", std::process::id()));
    std::fs::write(&path, &ca().pem)?;
    Ok(FILE.get_or_init(|| path).clone())
}

/// A certificate for `names` signed by the test CA, and its key: (certificate PEM, key PEM).
pub fn leaf(names: &[&str]) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name.push(DnType::CommonName, "agent-sandbox test peer");
    let cert = params.signed_by(&key, &ca().issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}
