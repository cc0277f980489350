//! The dense ceiling: this CPU's dot-product peak, measured in the same run by the plainest loop
//! there is, back-to-back dot-product instructions on registers only, so that a dense layer's
//! GFLOP/s can be reported as a share of what the instruction it runs on can do. It plays for
//! the dense half the role [`crate::ceiling`] plays for the embedding stage: the bar is measured,
//! not read from a data sheet, so clocks, turbo, a hypervisor and a sibling hyperthread all count.
//!
//! Each [`PeakKind`] is one instruction: AMX `tdpbf16ps` / `tdpbssd` on tiles, AVX-512
//! `vdpbf16ps` / `vpdpbusd` / `vfmadd231ps` on zmm registers. The loop keeps enough independent
//! accumulators to cover the instruction's latency (four C tiles; ten to fourteen zmm ones),
//! loads nothing from memory inside the loop, and is timed with [`Instant`] in chunks of a few
//! tens of microseconds; the best of many short repetitions (about 2 ms each) is kept, so a
//! time slice lost to another process (a shared VM, a build next door) costs one repetition, not
//! the measurement. A multiply-accumulate counts as two operations: GFLOP/s for the float kinds,
//! GOP/s for int8.
//!
//! The core clock is read with a chain of dependent `imul`s (3 cycles each, [`core_clock_hz`])
//! right after each repetition, so a [`Peak`] can say how many cycles one instruction takes at
//! the clock of that moment: under a hypervisor the host moves the clock in 100 MHz steps with
//! its own load (between ~1.2 and 3 GHz on the VM this was written on, within minutes), so the
//! peak is a measurement of this run, not a constant. The chain reads the clock of scalar code:
//! where the core caps its clock while a heavy unit is busy (a frequency licence), the
//! instruction shows more cycles than its data-sheet throughput. On that VM (Emerald Rapids):
//! `tdpbf16ps` ran at ~140 M/s per core whatever the scalar clock (2.4 - 3 GHz), i.e. 16 cycles
//! at an AMX cap of ~2.25 GHz (an `imul` chain interleaved with the tiles reads 2.27 GHz), 21
//! cycles of a 2.98 GHz scalar clock; `vfmadd231ps zmm` ran 2 per cycle up to a cap of ~2.8 GHz.

use std::fmt;
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[cfg(target_arch = "x86_64")]
mod x86;

/// One dot-product instruction whose throughput is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeakKind {
    /// AMX-BF16 `tdpbf16ps`: 16 x 16 x 32 bf16 multiply-accumulates into f32 tiles.
    AmxBf16,
    /// AMX-INT8 `tdpbssd`: 16 x 16 x 64 int8 multiply-accumulates into i32 tiles.
    AmxInt8,
    /// AVX512_BF16 `vdpbf16ps zmm`: 16 lanes x 2 bf16 pairs into f32.
    Avx512Bf16,
    /// AVX512_VNNI `vpdpbusd zmm`: 16 lanes x 4 u8 x i8 products into i32.
    Avx512Vnni,
    /// AVX-512F `vfmadd231ps zmm`: 16 f32 multiply-accumulates.
    Fma32,
    /// AVX2 / FMA `vfmadd231ps ymm`: 8 f32 multiply-accumulates (the f32 ceiling of a CPU
    /// without AVX-512: AMD Zen 2 / 3, older Xeons).
    Fma32Avx2,
}

impl PeakKind {
    /// Every kind, tiles first.
    pub const ALL: [PeakKind; 6] = [
        PeakKind::AmxBf16,
        PeakKind::AmxInt8,
        PeakKind::Avx512Bf16,
        PeakKind::Avx512Vnni,
        PeakKind::Fma32,
        PeakKind::Fma32Avx2,
    ];

    /// The f32 FMA ceiling of this CPU: on zmm where it has AVX-512F, else on ymm.
    pub fn fma32() -> PeakKind {
        #[cfg(target_arch = "x86_64")]
        if !std::is_x86_feature_detected!("avx512f") {
            return PeakKind::Fma32Avx2;
        }
        PeakKind::Fma32
    }

    /// Short lower-case name (`amx-bf16`, `amx-int8`, `avx512-bf16`, `avx512-vnni`, `fma32`).
    pub fn name(self) -> &'static str {
        match self {
            PeakKind::AmxBf16 => "amx-bf16",
            PeakKind::AmxInt8 => "amx-int8",
            PeakKind::Avx512Bf16 => "avx512-bf16",
            PeakKind::Avx512Vnni => "avx512-vnni",
            PeakKind::Fma32 => "fma32",
            PeakKind::Fma32Avx2 => "fma32-avx2",
        }
    }

    /// The instruction the loop repeats.
    pub fn instruction(self) -> &'static str {
        match self {
            PeakKind::AmxBf16 => "tdpbf16ps",
            PeakKind::AmxInt8 => "tdpbssd",
            PeakKind::Avx512Bf16 => "vdpbf16ps zmm",
            PeakKind::Avx512Vnni => "vpdpbusd zmm",
            PeakKind::Fma32 => "vfmadd231ps zmm",
            PeakKind::Fma32Avx2 => "vfmadd231ps ymm",
        }
    }

    /// Multiply-accumulates one instruction does.
    pub fn macs_per_instruction(self) -> u64 {
        match self {
            PeakKind::AmxBf16 => 16 * 16 * 32,
            PeakKind::AmxInt8 => 16 * 16 * 64,
            PeakKind::Avx512Bf16 => 16 * 2,
            PeakKind::Avx512Vnni => 16 * 4,
            PeakKind::Fma32 => 16,
            PeakKind::Fma32Avx2 => 8,
        }
    }

    /// Operations (2 per multiply-accumulate) one instruction does.
    pub fn ops_per_instruction(self) -> u64 {
        2 * self.macs_per_instruction()
    }

    /// Whether the operations are integer (GOP/s) rather than floating point (GFLOP/s).
    pub fn is_integer(self) -> bool {
        matches!(self, PeakKind::AmxInt8 | PeakKind::Avx512Vnni)
    }

    /// The unit a rate of this kind is printed in: `GFLOP/s` or `GOP/s`.
    pub fn unit(self) -> &'static str {
        if self.is_integer() {
            "GOP/s"
        } else {
            "GFLOP/s"
        }
    }

    /// `Ok` when this CPU (and this process's permissions) can run the instruction, else why
    /// not. AMX asks Linux for the tile permission on first use (once per process). This is
    /// the hardware's peak: `EMBER_ISA` / `EMBER_DENSE_ISA` do not restrict it.
    pub fn available(self) -> Result<(), Missing> {
        Features::detect().check(self)
    }
}

impl fmt::Display for PeakKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A measured peak: the best repetition's instruction rate, summed over the threads.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    /// The instruction measured.
    pub kind: PeakKind,
    /// Threads that ran the loop at once.
    pub threads: usize,
    /// Instructions per second, all threads together.
    pub instructions_per_sec: f64,
    /// The scalar core clock (Hz, mean over the threads) read right after the best repetition;
    /// `None` off x86-64. A frequency licence that caps the clock while the unit is busy is not
    /// in it (see the module documentation).
    pub clock_hz: Option<f64>,
}

impl Peak {
    /// Operations per second (2 per multiply-accumulate), all threads together.
    pub fn ops_per_sec(&self) -> f64 {
        self.instructions_per_sec * self.kind.ops_per_instruction() as f64
    }

    /// [`Peak::ops_per_sec`] in G (GFLOP/s or GOP/s, see [`PeakKind::unit`]).
    pub fn gops(&self) -> f64 {
        self.ops_per_sec() / 1e9
    }

    /// Cycles of [`Peak::clock_hz`] one thread spends per instruction (its reciprocal
    /// throughput). Two threads that share a core's unit show twice the single-thread count; a
    /// frequency licence shows as extra cycles (AMX on Emerald Rapids: ~21 at 2.98 GHz, which
    /// are 16 at the ~2.25 GHz the core runs tiles at).
    pub fn cycles_per_instruction(&self) -> Option<f64> {
        let per_thread = self.instructions_per_sec / self.threads.max(1) as f64;
        self.clock_hz.map(|hz| hz / per_thread)
    }

    /// Operations per cycle of [`Peak::clock_hz`] per thread.
    pub fn ops_per_cycle(&self) -> Option<f64> {
        self.cycles_per_instruction()
            .map(|c| self.kind.ops_per_instruction() as f64 / c)
    }

    /// A measured rate (ops/s, 2 per multiply-accumulate) as a fraction of this peak.
    pub fn share(&self, ops_per_sec: f64) -> f64 {
        ops_per_sec / self.ops_per_sec()
    }
}

/// What this machine lacks to run an instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// A CPU feature (its name: "AVX-512F", "AVX512_BF16", ...).
    Feature(&'static str),
    /// AMX tiles: the CPU has none, or Linux refused this process the permission (its words).
    Tiles(String),
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missing::Feature(what) => write!(f, "the CPU has no {what}"),
            Missing::Tiles(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Missing {}

/// A kind this machine cannot run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The instruction asked for.
    pub kind: PeakKind,
    /// Why it cannot run here.
    pub reason: Missing,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}) is not available: {}",
            self.kind,
            self.kind.instruction(),
            self.reason
        )
    }
}

impl std::error::Error for Unavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.reason)
    }
}

/// The outcome of one measurement: a peak, or the reason the kind cannot run here.
pub type PeakResult = Result<Peak, Unavailable>;

/// The peak of `kind` on one thread (the calling thread), measured for about `duration`.
pub fn measure(kind: PeakKind, duration: Duration) -> PeakResult {
    measure_threads(kind, 1, duration)
}

/// The peak of `kind` with `threads` threads (at least 1) running the loop at once, each for
/// about `duration`, their rates summed. More threads than cores share the cores.
pub fn measure_threads(kind: PeakKind, threads: usize, duration: Duration) -> PeakResult {
    measure_on(&Features::detect(), kind, threads, duration)
}

/// Every kind with `threads` threads, each for about `duration`, in [`PeakKind::ALL`] order.
pub fn measure_all(threads: usize, duration: Duration) -> Vec<PeakResult> {
    PeakKind::ALL
        .into_iter()
        .map(|k| measure_threads(k, threads, duration))
        .collect()
}

/// The core clock (Hz) on the calling thread now, read by a chain of dependent `imul`s for about
/// `duration` (the best of samples of about 20 us, short enough that some run whole between
/// another process's time slices); `None` off x86-64.
pub fn core_clock_hz(duration: Duration) -> Option<f64> {
    let samples = (duration.as_micros() / CLOCK_SAMPLE.as_micros()).clamp(1, 100_000) as u32;
    let each = duration / samples;
    (0..samples)
        .map(|_| clock_sample(each))
        .try_fold(0.0f64, |best, c| c.map(|c| best.max(c)))
}

/// One reading of the clock over about `duration`.
fn clock_sample(duration: Duration) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        let start = Instant::now();
        let mut chunks = 0u64;
        let elapsed = loop {
            x86::imul_chain(x86::CLOCK_ITERS);
            chunks += 1;
            let e = start.elapsed();
            if e >= duration {
                break e;
            }
        };
        let cycles = (chunks * x86::CLOCK_ITERS * x86::CLOCK_CYCLES_PER_ITER) as f64;
        Some(cycles / elapsed.as_secs_f64())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = duration;
        None
    }
}

/// Formats results as a table, one line per kind: rate, unit, cycles per instruction and
/// operations per cycle per thread where the clock is known, or why the kind is not available.
pub fn table(results: &[PeakResult]) -> String {
    let mut out = String::new();
    for r in results {
        let line = match r {
            Ok(p) => {
                let cycles = match (p.cycles_per_instruction(), p.ops_per_cycle(), p.clock_hz) {
                    (Some(c), Some(o), Some(hz)) => format!(
                        "{c:6.2} cycles/instr/thread  {o:7.1} ops/cycle/thread  (clock {:.2} GHz)",
                        hz / 1e9
                    ),
                    _ => String::new(),
                };
                format!(
                    "{:<12} {:<16} {} thr {:>9.1} {:<8} {cycles}",
                    p.kind.name(),
                    p.kind.instruction(),
                    p.threads,
                    p.gops(),
                    p.kind.unit(),
                )
            }
            Err(u) => format!(
                "{:<12} {:<16} not available: {}",
                u.kind.name(),
                u.kind.instruction(),
                u.reason
            ),
        };
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What this CPU and process can run, as the measurements see it (tests pass their own).
#[derive(Debug, Clone)]
struct Features {
    avx512f: bool,
    /// AVX2 and FMA.
    avx2: bool,
    avx512bf16: bool,
    avx512vnni: bool,
    /// `Err(why)` when AMX tiles cannot run (no AMX, or Linux refused the permission).
    amx: Result<(), Missing>,
}

impl Features {
    #[cfg(target_arch = "x86_64")]
    fn detect() -> Features {
        use ember_model::dense::cpu;
        let amx = if cpu::amx_permitted() {
            Ok(())
        } else {
            Err(Missing::Tiles(
                cpu::amx_refusal()
                    .unwrap_or("the CPU has no AMX tiles")
                    .to_string(),
            ))
        };
        Features {
            avx512f: std::is_x86_feature_detected!("avx512f"),
            avx2: std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"),
            avx512bf16: std::is_x86_feature_detected!("avx512bf16"),
            avx512vnni: std::is_x86_feature_detected!("avx512vnni"),
            amx,
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> Features {
        Features::none("not an x86-64 CPU")
    }

    /// Nothing available, AMX for `why`.
    #[cfg(any(test, not(target_arch = "x86_64")))]
    fn none(why: &str) -> Features {
        Features {
            avx512f: false,
            avx2: false,
            avx512bf16: false,
            avx512vnni: false,
            amx: Err(Missing::Tiles(why.to_string())),
        }
    }

    fn check(&self, kind: PeakKind) -> Result<(), Missing> {
        let need = |ok: bool, what: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(Missing::Feature(what))
            }
        };
        match kind {
            PeakKind::AmxBf16 | PeakKind::AmxInt8 => self.amx.clone(),
            PeakKind::Avx512Bf16 => {
                need(self.avx512f, "AVX-512F").and(need(self.avx512bf16, "AVX512_BF16"))
            }
            PeakKind::Avx512Vnni => {
                need(self.avx512f, "AVX-512F").and(need(self.avx512vnni, "AVX512_VNNI"))
            }
            PeakKind::Fma32 => need(self.avx512f, "AVX-512F"),
            PeakKind::Fma32Avx2 => need(self.avx2, "AVX2 / FMA"),
        }
    }
}

/// The length of one repetition; the best repetition counts (the first ones also warm the unit
/// up and settle its frequency).
const REP: Duration = Duration::from_millis(2);
/// The clock reading after each repetition: the best of three short samples (one may be cut
/// by another process's time slice, the first after tiles reads low).
const CLOCK_SAMPLE: Duration = Duration::from_micros(20);
const CLOCK_SAMPLES: u32 = 3;

fn measure_on(
    features: &Features,
    kind: PeakKind,
    threads: usize,
    duration: Duration,
) -> PeakResult {
    features
        .check(kind)
        .map_err(|reason| Unavailable { kind, reason })?;
    let threads = threads.max(1);
    let reps = (duration.as_nanos() / REP.as_nanos()).clamp(3, 1000) as usize;
    let rep = (duration / reps as u32).max(Duration::from_micros(500));
    // Every thread runs each repetition at the same time (a barrier before each), so the sum
    // of their rates is what the cores do together; each then reads its clock.
    let barrier = Barrier::new(threads);
    let per_thread: Vec<Vec<(f64, Option<f64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    (0..reps)
                        .map(|_| {
                            barrier.wait();
                            let rate = run_rep(kind, rep);
                            (rate, core_clock_hz(CLOCK_SAMPLE * CLOCK_SAMPLES))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a dense peak thread panicked"))
            .collect()
    });
    let (instructions_per_sec, clock_hz) = (0..reps)
        .map(|r| {
            let rate = per_thread.iter().map(|t| t[r].0).sum::<f64>();
            let clocks: Option<Vec<f64>> = per_thread.iter().map(|t| t[r].1).collect();
            let clock = clocks.map(|c| c.iter().sum::<f64>() / c.len() as f64);
            (rate, clock)
        })
        .fold((0.0, None), |best, r| if r.0 > best.0 { r } else { best });
    Ok(Peak {
        kind,
        threads,
        instructions_per_sec,
        clock_hz,
    })
}

/// Runs `kind`'s loop on this thread in chunks until `rep` has passed; instructions per second.
/// The caller checked that the kind is available.
fn run_rep(kind: PeakKind, rep: Duration) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        let per_chunk = x86::instructions_per_chunk(kind);
        let start = Instant::now();
        let mut chunks = 0u64;
        let elapsed = loop {
            // SAFETY: `measure_on` checked `kind` against the CPU's features (and AMX's
            // permission) before any thread got here.
            unsafe { x86::chunk(kind) };
            chunks += 1;
            let e = start.elapsed();
            if e >= rep {
                break e;
            }
        };
        (chunks * per_chunk) as f64 / elapsed.as_secs_f64()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kind, rep);
        unreachable!("no kind is available off x86-64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short: 40 ms per kind and thread count.
    const SHORT: Duration = Duration::from_millis(40);

    /// One test measures (two at once would share the cores and skew the printed table): every
    /// available kind gives a positive finite rate, on 1 and 2 threads; unavailable kinds say
    /// why. `cargo test -p ember-bench --release dense_peak -- --nocapture` prints the table.
    #[test]
    fn dense_peak_each_available_kind_has_a_positive_rate() {
        for threads in [1, 2] {
            let results = measure_all(threads, SHORT);
            println!("dense peaks, {threads} thread(s):\n{}", table(&results));
            for (r, kind) in results.iter().zip(PeakKind::ALL) {
                match r {
                    Ok(p) => {
                        assert_eq!(p.kind, kind);
                        assert_eq!(p.threads, threads);
                        assert!(p.instructions_per_sec.is_finite() && p.instructions_per_sec > 0.0);
                        assert!(p.gops().is_finite() && p.gops() > 0.0, "{p:?}");
                        if let Some(c) = p.cycles_per_instruction() {
                            assert!(c.is_finite() && c > 0.0, "{p:?}");
                        }
                        assert!((p.share(p.ops_per_sec()) - 1.0).abs() < 1e-12);
                    }
                    Err(u) => {
                        assert_eq!(u.kind, kind);
                        assert!(!u.reason.to_string().is_empty());
                        assert_eq!(kind.available(), Err(u.reason.clone()));
                    }
                }
            }
        }
    }

    #[test]
    fn dense_peak_unavailable_kinds_are_reported_not_run() {
        let none = Features::none("no tiles in this test");
        for kind in PeakKind::ALL {
            let r = measure_on(&none, kind, 2, SHORT);
            let u = r.expect_err("nothing is available");
            assert_eq!(u.kind, kind);
            assert!(!u.reason.to_string().is_empty());
            assert!(u.to_string().contains(kind.name()));
        }
        let text = table(&[measure_on(&none, PeakKind::AmxBf16, 1, SHORT)]);
        assert!(
            text.contains("not available: no tiles in this test"),
            "{text}"
        );
        // AVX-512F alone: FMA runs, the dot-product extensions are named as missing.
        let f = Features {
            avx512f: true,
            ..none
        };
        assert!(f.check(PeakKind::Fma32).is_ok());
        assert_eq!(
            f.check(PeakKind::Fma32Avx2),
            Err(Missing::Feature("AVX2 / FMA"))
        );
        assert_eq!(
            f.check(PeakKind::Avx512Bf16),
            Err(Missing::Feature("AVX512_BF16"))
        );
        assert_eq!(
            f.check(PeakKind::Avx512Vnni),
            Err(Missing::Feature("AVX512_VNNI"))
        );
        assert_eq!(
            f.check(PeakKind::Fma32Avx2).unwrap_err().to_string(),
            "the CPU has no AVX2 / FMA"
        );
    }

    #[test]
    fn dense_peak_counts_ops() {
        assert_eq!(PeakKind::AmxBf16.ops_per_instruction(), 16384);
        assert_eq!(PeakKind::AmxInt8.ops_per_instruction(), 32768);
        assert_eq!(PeakKind::Avx512Bf16.ops_per_instruction(), 64);
        assert_eq!(PeakKind::Avx512Vnni.ops_per_instruction(), 128);
        assert_eq!(PeakKind::Fma32.ops_per_instruction(), 32);
        assert_eq!(PeakKind::Fma32Avx2.ops_per_instruction(), 16);
        let p = Peak {
            kind: PeakKind::AmxBf16,
            threads: 2,
            instructions_per_sec: 2.0 * 2e8,
            clock_hz: Some(3.2e9),
        };
        assert!((p.cycles_per_instruction().unwrap() - 16.0).abs() < 1e-9);
        assert!((p.ops_per_cycle().unwrap() - 1024.0).abs() < 1e-9);
        assert!((p.gops() - 6553.6).abs() < 1e-6);
    }
}
