//! Build progress: a spinner per image and an overall bar on a terminal, plain timestamped lines
//! elsewhere (CI logs), nothing when quiet.

use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ProgressMode {
    /// Bars on a terminal, plain lines otherwise
    #[default]
    Auto,
    /// One line per state change, for logs
    Plain,
    /// Only errors
    Quiet,
}

pub struct Progress {
    start: Instant,
    bars: Option<Bars>,
    quiet: bool,
    /// Added to every image's name: the platform, when a walk builds another than the host's.
    suffix: String,
}

struct Bars {
    multi: MultiProgress,
    overall: ProgressBar,
    images: Mutex<Vec<(String, ProgressBar)>>,
}

impl Progress {
    pub fn new(mode: ProgressMode, total: usize) -> Progress {
        let bars = (mode == ProgressMode::Auto && std::io::stderr().is_terminal()).then(|| {
            let multi = MultiProgress::new();
            let overall = multi.add(ProgressBar::new(total as u64));
            overall.set_style(
                ProgressStyle::with_template("{elapsed:>5} [{bar:30}] {pos}/{len} images")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            overall.enable_steady_tick(Duration::from_millis(200));
            Bars { multi, overall, images: Mutex::new(Vec::new()) }
        });
        Progress { start: Instant::now(), bars, quiet: mode == ProgressMode::Quiet, suffix: String::new() }
    }

    /// Every image's name followed by ` (what)`: two walks' lines told apart.
    pub fn naming(mut self, what: &str) -> Progress {
        self.suffix = format!(" ({what})");
        self
    }

    fn bar(&self, bars: &Bars, name: &str) -> ProgressBar {
        let mut images = bars.images.lock().expect("progress lock");
        if let Some((_, bar)) = images.iter().find(|(n, _)| n == name) {
            return bar.clone();
        }
        let bar = bars.multi.insert_before(&bars.overall, ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed:>5} {prefix:<10} {wide_msg}")
                .expect("a valid template"),
        );
        bar.set_prefix(format!("{name}{}", self.suffix));
        bar.enable_steady_tick(Duration::from_millis(120));
        images.push((name.to_string(), bar.clone()));
        bar
    }

    /// The image is in a new state (started, at a new build step, …).
    pub fn state(&self, name: &str, message: &str) {
        match &self.bars {
            Some(bars) => self.bar(bars, name).set_message(message.to_string()),
            None if !self.quiet => self.line(name, message),
            None => {}
        }
    }

    /// The image is done, one way or another; `message` is its final line.
    pub fn finish(&self, name: &str, message: &str) {
        match &self.bars {
            Some(bars) => {
                let bar = self.bar(bars, name);
                bar.finish_with_message(message.to_string());
                bars.overall.inc(1);
            }
            None if !self.quiet => self.line(name, message),
            None => {}
        }
    }

    /// A message that is not about one image.
    pub fn note(&self, message: &str) {
        match &self.bars {
            Some(bars) => {
                let _ = bars.multi.println(message);
            }
            None if !self.quiet => eprintln!("[{:>6.1}s] {message}", self.start.elapsed().as_secs_f64()),
            None => {}
        }
    }

    fn line(&self, name: &str, message: &str) {
        eprintln!("[{:>6.1}s] {name}{}: {message}", self.start.elapsed().as_secs_f64(), self.suffix);
    }

    pub fn done(&self) {
        if let Some(bars) = &self.bars {
            bars.overall.finish();
        }
    }
}
