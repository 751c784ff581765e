//! `cargo xtask`: parse the flags, run one command.

use clap::Parser as _;
use xtask::flags::{Command, Xtask};
use xtask::{bench, build, graph, project, publish, registry, test};

fn main() -> std::process::ExitCode {
    let flags = Xtask::parse();
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the async runtime");
    match runtime.block_on(run(flags)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(flags: Xtask) -> anyhow::Result<()> {
    let root = project::root();
    match flags.command {
        Command::Build(f) => {
            let mut opts = build::BuildOptions::new(&root);
            f.common.apply(&mut opts);
            opts.images = f.images;
            opts.locked = f.locked;
            let report = build::build(&opts).await?;
            report.ensure_success()?;
            let built = report.built().len();
            let fresh = report.up_to_date().len();
            eprintln!(
                "{} images: {built} built, {fresh} up to date (OS layer: {}); {} {}",
                report.results.len(),
                report.os_source,
                if opts.locked { "verified against" } else { "recorded in" },
                opts.lock_path.display()
            );
            Ok(())
        }
        Command::Graph(f) => {
            let graph = graph::ImageGraph::discover(&root.join("images"))?;
            let out = if f.json {
                graph.render_json()
            } else if f.dot {
                graph.render_dot()
            } else {
                graph.render_text()
            };
            print!("{out}");
            if !out.ends_with('\n') {
                println!();
            }
            Ok(())
        }
        Command::Bench(f) => bench::run(&root, f).await,
        Command::Test(f) => test::run(&root, f).await,
        Command::Publish(f) => {
            let mut build = build::BuildOptions::new(&root);
            f.common.apply(&mut build);
            build.images = f.images;
            let opts = publish::PublishOptions {
                build,
                registry: registry::Registry::parse(&f.registry)?,
                dry_run: f.dry_run,
                backoff: std::time::Duration::from_secs(2),
                attempts: 4,
            };
            let published = publish::publish(&opts).await?;
            if !opts.dry_run {
                eprintln!(
                    "{} images published; pinned in {}",
                    published.len(),
                    opts.build.lock_path.display()
                );
                print!(
                    "{}",
                    publish::digests(
                        &xtask::lock::ImagesLock::read(&opts.build.lock_path)?,
                        publish::DigestFormat::Text
                    )
                );
            }
            Ok(())
        }
        Command::List(f) => xtask::list::run(f.all).await,
        Command::Prune(f) => {
            use xtask::prune;
            let opts = prune::PruneOptions {
                lock_path: root.join(xtask::lock::FILE_NAME),
                prefix: f.prefix,
                dry_run: f.dry_run,
                grace: prune::GRACE,
            };
            let report =
                prune::prune(&opts, |image, outcome| eprintln!("{}", prune::describe(image, outcome)))
                    .await?;
            eprintln!("{}", report.summary(opts.dry_run));
            Ok(())
        }
        Command::NewAgent(f) => {
            use xtask::scaffold::{NewAgent, Source};
            let source = match (f.npm, f.pip, f.from) {
                (Some(package), _, _) => Source::Npm(package),
                (_, Some(package), _) => Source::Pip(package),
                (_, _, Some(image)) => Source::From(image),
                _ => unreachable!("clap requires one source"),
            };
            let agent = NewAgent {
                cmd: f.cmd.unwrap_or_else(|| f.name.clone()),
                name: f.name,
                source,
                domains: f.domains,
            };
            for path in xtask::scaffold::write(&root, &agent)? {
                println!("created {}", path.display());
            }
            print!("next steps:\n{}", xtask::scaffold::next_steps(&agent));
            Ok(())
        }
        Command::Digests(f) => {
            let lock = xtask::lock::ImagesLock::read(&root.join(xtask::lock::FILE_NAME))?;
            let format = if f.json {
                publish::DigestFormat::Json
            } else if f.markdown {
                publish::DigestFormat::Markdown
            } else {
                publish::DigestFormat::Text
            };
            let out = publish::digests(&lock, format);
            if lock.images.values().all(|e| e.pinned.is_none()) {
                eprintln!(
                    "no image in images.lock is published yet (cargo xtask publish --registry HOST/NAMESPACE)"
                );
            }
            print!("{out}");
            Ok(())
        }
    }
}
