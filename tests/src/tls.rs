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

/// A CA certificate that stays the same from run to run on this machine (kept in the user's
/// cache, made where missing), for the build's extra-CA test: an image built with it is found
/// in the engine's cache by the next run, where the process's own CA would rebuild the OS layer,
/// base and shell every time. Nothing is signed with it; its key is not kept.
pub fn lasting_ca_file() -> anyhow::Result<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| crate::root().join("target"));
    let dir = cache.join("agent-sandbox");
    let path = dir.join("build-test-ca.pem");
    if std::fs::read_to_string(&path).is_ok_and(|pem| pem.contains("BEGIN CERTIFICATE")) {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "agent-sandbox build test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let tmp = dir.join(format!("build-test-ca.pem.{}", std::process::id()));
    std::fs::write(&tmp, params.self_signed(&key)?.pem())?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
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
