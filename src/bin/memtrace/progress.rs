//! The progress bar shown on stderr while a long trace is read.
//!
//! Nothing is drawn unless stderr is a terminal, and nothing appears for runs shorter than
//! half a second, so short runs and redirected output stay clean.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a run must last before its bar appears.
const SHOW_AFTER: Duration = Duration::from_millis(500);

/// Progress through a file of known size, in bytes read.
#[derive(Debug)]
pub struct Progress {
    /// `None` when no bar must ever be drawn.
    state: Option<State>,
}

#[derive(Debug)]
struct State {
    total: u64,
    label: String,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar for reading `total` bytes, labelled `label`, drawn only on a terminal.
    pub fn new(total: u64, label: &str) -> Progress {
        let enabled = std::io::stderr().is_terminal();
        Progress {
            state: enabled.then(|| State { total, label: label.to_string(), started: Instant::now(), bar: None }),
        }
    }

    /// Record that `position` bytes have been read.
    pub fn update(&mut self, position: u64) {
        let Some(state) = &mut self.state else { return };
        if state.bar.is_none() && state.started.elapsed() >= SHOW_AFTER {
            let bar = ProgressBar::hidden().with_position(position);
            bar.set_length(state.total);
            if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})") {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(state.label.clone());
            bar.set_draw_target(ProgressDrawTarget::stderr());
            state.bar = Some(bar);
        }
        if let Some(bar) = &state.bar {
            bar.set_position(position);
        }
    }

    /// Remove the bar, if one was drawn.
    pub fn finish(&mut self) {
        if let Some(bar) = self.state.as_mut().and_then(|s| s.bar.take()) {
            bar.finish_and_clear();
        }
    }
}
