//! What a replacement takes over from the store while the root replays towards it.

use super::store_client;
use sluice_nf::Instance;

/// The read a [`Rebuilder::replacement_reading`] thread does for a replacement: its parts come
/// as the store reads them; the replacement takes each in as soon as it can
/// ([`RecoveryReading::poll`]), and waits for the rest only before it processes its first
/// packet ([`RecoveryReading::finish`]).
pub struct RecoveryReading {
    pub(super) parts: std::sync::mpsc::Receiver<Option<sluice_store::Takeover>>,
    /// How many readers the store put on it ([`sluice_store::Backend::takeover`]), or why it could not.
    pub(super) outcome: std::sync::mpsc::Receiver<Result<usize, String>>,
    /// Readers that have ended, and how many there are once known.
    pub(super) ends: (usize, Option<usize>),
    /// Whether the values came in every part so far (a backend that cannot list them sends
    /// none).
    pub(super) every_value: bool,
}

impl RecoveryReading {
    /// Gives `inst` the parts that have arrived; whether the read is complete.
    pub fn poll(&mut self, inst: &mut Instance) -> Result<bool, String> {
        self.turn(inst, None)
    }

    /// Gives `inst` the rest of the read, waiting up to `limit` for it.
    pub fn finish(&mut self, inst: &mut Instance, limit: std::time::Duration) -> Result<(), String> {
        let deadline = std::time::Instant::now() + limit;
        match self.turn(inst, Some(deadline))? {
            true => Ok(()),
            false => Err(format!("the store did not answer the replacement's read within {limit:?}")),
        }
    }

    /// Takes in what has come (waiting until `deadline` for the rest, if given); whether the
    /// read is complete.
    fn turn(&mut self, inst: &mut Instance, deadline: Option<std::time::Instant>) -> Result<bool, String> {
        use std::sync::mpsc::RecvTimeoutError;
        let left = |d: std::time::Instant| d.saturating_duration_since(std::time::Instant::now());
        loop {
            if self.ends.1.is_none() {
                let outcome = match deadline {
                    None => match self.outcome.try_recv() {
                        Ok(o) => o,
                        Err(_) => {
                            self.take_arrived(inst);
                            return Ok(false);
                        }
                    },
                    Some(d) => match self.outcome.recv_timeout(left(d)) {
                        Ok(o) => o,
                        Err(RecvTimeoutError::Timeout) => return Ok(false),
                        Err(RecvTimeoutError::Disconnected) => return Err("the reading thread ended".into()),
                    },
                };
                self.ends.1 = Some(outcome?);
            }
            if self.complete(inst) {
                return Ok(true);
            }
            let part = match deadline {
                None => {
                    self.take_arrived(inst);
                    return Ok(self.complete(inst));
                }
                Some(d) => match self.parts.recv_timeout(left(d)) {
                    Ok(part) => part,
                    Err(RecvTimeoutError::Timeout) => return Ok(false),
                    Err(RecvTimeoutError::Disconnected) => return Err("the store's read ended early".into()),
                },
            };
            self.take(part, inst);
        }
    }

    /// Takes in the parts that have arrived, without waiting (with every sender gone too:
    /// complete or not, [`Self::complete`] tells).
    fn take_arrived(&mut self, inst: &mut Instance) {
        while let Ok(part) = self.parts.try_recv() {
            self.take(part, inst);
        }
    }

    /// Whether every reader ended; then says so to `inst`'s client (once).
    fn complete(&mut self, inst: &mut Instance) -> bool {
        let (ended, readers) = self.ends;
        if readers != Some(ended) {
            return false;
        }
        if std::mem::take(&mut self.every_value) {
            if let Some(c) = store_client(inst) {
                c.took_over_every_value();
            }
        }
        true
    }

    /// Takes one part in (`None`: a reader ended).
    fn take(&mut self, part: Option<sluice_store::Takeover>, inst: &mut Instance) {
        match part {
            Some(part) => {
                self.every_value &= part.values.is_some();
                if let Some(c) = store_client(inst) {
                    c.take_over(part);
                }
            }
            None => self.ends.0 += 1,
        }
    }
}
