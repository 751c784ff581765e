//! `cargo xtask publish` against a real registry on loopback: digests pinned as the registry
//! serves them, pulls by digest, idempotence, and the failures that must leave the lock alone.

use std::time::Duration;

use sandbox_tests::images::ScratchImages;
use sandbox_tests::registry::{LocalRegistry, PASSWORD, USER};
use xtask::engine::Engine;
use xtask::lock::ImagesLock;
use xtask::platform::Platform;
use xtask::publish::{PublishOptions, publish};
use xtask::registry::Registry;

/// Removes the local tags under a registry's address when the test ends, passed or not.
struct UntagOnDrop(String);

impl Drop for UntagOnDrop {
    fn drop(&mut self) {
        let prefix = self.0.clone();
        sandbox_tests::docker::drop_async(move || sandbox_tests::images::remove_tags_with_prefix(prefix));
    }
}

fn options(scratch: &ScratchImages, registry: &str) -> anyhow::Result<PublishOptions> {
    Ok(PublishOptions {
        build: scratch.options()?,
        registry: Registry::parse(&format!("{registry}/test"))?,
        dry_run: false,
        backoff: Duration::from_millis(200),
        attempts: 3,
        platforms: Vec::new(),
    })
}

#[tokio::test]
async fn publish_pins_the_served_digest_and_a_pull_by_digest_gives_the_same_image() -> anyhow::Result<()> {
    let registry = LocalRegistry::start(false)?;
    let _untag = UntagOnDrop(format!("{}/", registry.addr));
    let scratch = ScratchImages::copy("publish", &["os", "base"])?;
    let opts = options(&scratch, &registry.addr)?;
    let published = publish(&opts).await?;
    assert_eq!(
        published.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["os", "base"],
        "parents first"
    );

    let lock = ImagesLock::read(&scratch.lock_path())?;
    let local = xtask::lock::LocalImages::read(&scratch.lock_path())?;
    let engine = Engine::connect().await?;
    for p in &published {
        let entry = &lock.images[&p.name];
        assert_eq!(entry.pinned.as_ref(), Some(&p.pinned), "{}: the lock pins what was published", p.name);
        // The registry's own answer, fetched independently of publish: the index under the
        // version tag, of the host's manifest alone.
        let (digest, index) = xtask::registry::index(&opts.registry, &p.name, xtask::project::VERSION, None)?;
        let index: serde_json::Value = serde_json::from_slice(&index)?;
        assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1), "{index}");
        assert!(p.pinned.ends_with(&format!("@{digest}")), "{} vs the registry's {digest}", p.pinned);
        // Forget the registry's tags locally, then pull by digest.
        let repository = opts.registry.repository(&p.name);
        for tag in engine.tags_with_prefix(&format!("{repository}:")).await? {
            engine.remove_tag(&tag).await?;
        }
        assert_eq!(
            engine.image_id(&p.pinned).await?,
            None,
            "{} still resolves locally: no real pull",
            p.pinned
        );
        let pulled = engine.ensure_pulled(&p.pinned).await?;
        assert_eq!(pulled, local.images[&p.name].id, "pulling {} gives the image published", p.pinned);
    }

    let again = publish(&opts).await?;
    assert_eq!(again, published, "a second publish of unchanged images changes no digest");
    Ok(())
}

/// Both platforms' `os` (the arm64 one bootstrapped under qemu-user) in one OCI index: the lock
/// pins the index's digest, the index lists each platform's manifest with its platform, and a
/// pull of the pinned reference for each platform gets that platform's image.
#[tokio::test]
async fn publish_pushes_one_index_of_both_platforms_and_a_pull_picks_each() -> anyhow::Result<()> {
    xtask::emulation::ensure(Platform::Arm64)?;
    let registry = LocalRegistry::start(false)?;
    let _untag = UntagOnDrop(format!("{}/", registry.addr));
    let scratch = ScratchImages::copy("publish-index", &["os"])?;
    let mut opts = options(&scratch, &registry.addr)?;
    opts.platforms = vec![Platform::Amd64, Platform::Arm64];
    let published = publish(&opts).await?;
    let [p] = published.as_slice() else { anyhow::bail!("one image published: {published:?}") };
    assert_eq!(ImagesLock::read(&scratch.lock_path())?.images["os"].pinned.as_ref(), Some(&p.pinned));

    let (digest, bytes) = xtask::registry::index(&opts.registry, "os", xtask::project::VERSION, None)?;
    assert!(p.pinned.ends_with(&format!("@{digest}")), "{} pins the index, {digest}", p.pinned);
    let index: serde_json::Value = serde_json::from_slice(&bytes)?;
    assert_eq!(index["mediaType"], "application/vnd.oci.image.index.v1+json", "{index}");
    let listed: Vec<(String, Option<String>)> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let platform = &m["platform"];
            (
                format!(
                    "{}/{}",
                    platform["os"].as_str().unwrap_or("?"),
                    platform["architecture"].as_str().unwrap_or("?")
                ),
                platform["variant"].as_str().map(str::to_string),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("linux/amd64".to_string(), None), ("linux/arm64".to_string(), Some("v8".to_string()))]
    );

    let engine = Engine::connect().await?;
    let repository = opts.registry.repository("os");
    for platform in [Platform::Arm64, Platform::Amd64] {
        for tag in engine.tags_with_prefix(&format!("{repository}:")).await? {
            engine.remove_tag(&tag).await?;
        }
        // The engine keeps one image per digest reference: the last platform's goes first.
        if engine.image_id(&p.pinned).await?.is_some() {
            engine.remove_tag(&p.pinned).await?;
        }
        assert_eq!(engine.image_id(&p.pinned).await?, None, "{} still resolves: no real pull", p.pinned);
        let pulled = engine.pull_for(&p.pinned, platform.name()).await?;
        let built =
            xtask::lock::LocalImages::read_for(&scratch.lock_path(), platform)?.images["os"].id.clone();
        assert_eq!(pulled, built, "pulling {} for {platform} gives the {platform} image", p.pinned);
    }
    Ok(())
}

#[tokio::test]
async fn a_registry_that_is_down_fails_and_leaves_the_lock_untouched() -> anyhow::Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    // publish tags the image for the registry before it finds the registry down.
    let _untag = UntagOnDrop(format!("127.0.0.1:{port}/"));
    let scratch = ScratchImages::copy("publish-down", &["os"])?;
    let opts = options(&scratch, &format!("127.0.0.1:{port}"))?;
    xtask::build::build(&opts.build).await?.ensure_success()?;
    let before = std::fs::read(scratch.lock_path())?;
    let error = format!("{:#}", publish(&opts).await.expect_err("nothing listens there"));
    assert!(error.contains(&format!("127.0.0.1:{port}")) && error.contains("connection refused"), "{error}");
    assert_eq!(std::fs::read(scratch.lock_path())?, before, "the lock changed");
    Ok(())
}

#[tokio::test]
async fn refused_credentials_fail_naming_the_registry_and_leave_the_lock_untouched() -> anyhow::Result<()> {
    let registry = LocalRegistry::start(true)?;
    let _untag = UntagOnDrop(format!("{}/", registry.addr));
    let scratch = ScratchImages::copy("publish-auth", &["os"])?;
    let opts = options(&scratch, &registry.addr)?;
    xtask::build::build(&opts.build).await?.ensure_success()?;
    let before = std::fs::read(scratch.lock_path())?;
    // The engine pushes with the credentials from the environment: this test's own process.
    // SAFETY: set before any thread of this test reads them; nextest runs one test per process.
    unsafe {
        std::env::set_var(xtask::registry::USER_ENV, USER);
        std::env::set_var(xtask::registry::PASSWORD_ENV, "wrong");
    }
    let error = format!("{:#}", publish(&opts).await.expect_err("wrong password"));
    assert!(error.contains(&format!("the registry {} refused the credentials", registry.addr)), "{error}");
    assert_eq!(std::fs::read(scratch.lock_path())?, before, "the lock changed");

    // The right password publishes, and the manifest is read back through the same auth.
    unsafe { std::env::set_var(xtask::registry::PASSWORD_ENV, PASSWORD) };
    let published = publish(&opts).await?;
    assert_eq!(
        ImagesLock::read(&scratch.lock_path())?.images["os"].pinned.as_ref(),
        Some(&published[0].pinned)
    );
    let engine = Engine::connect().await?;
    for tag in engine.tags_with_prefix(&format!("{}/", registry.addr)).await? {
        engine.remove_tag(&tag).await?;
    }
    Ok(())
}
