//! The dense layers at RM1's shapes: Ember's GEMM (AVX-512 where available) against faer, and the
//! batch-1 GEMV. Hot caches (the same weights every iteration); `ember bench model` shows the cold
//! case inside the whole forward pass.
//!
//! `cargo bench -p ember-model --bench dense`

use divan::{Bencher, black_box};
use ember_model::mlp::{Gemm, Linear};
use ember_model::random::normal_vec;
use faer::Par;

fn main() {
    divan::main();
}

const SHAPES: [(usize, usize); 3] = [(2048, 256), (592, 768), (768, 384)];

fn layer(i: usize, o: usize) -> Linear {
    Linear::new(
        i,
        o,
        normal_vec(i * o, 0.05, 1),
        normal_vec(o, 0.05, 2),
        true,
    )
}

#[divan::bench(args = SHAPES, consts = [1, 64])]
fn ember<const B: usize>(bencher: Bencher, (i, o): (usize, usize)) {
    let l = layer(i, o);
    let x = normal_vec(B * i, 1.0, 3);
    let mut y = vec![0f32; B * o];
    bencher.bench_local(|| l.forward_with(black_box(&x), B, &mut y, Par::Seq, Gemm::Ember));
}

#[divan::bench(args = SHAPES, consts = [64])]
fn faer<const B: usize>(bencher: Bencher, (i, o): (usize, usize)) {
    let l = layer(i, o);
    let x = normal_vec(B * i, 1.0, 3);
    let mut y = vec![0f32; B * o];
    bencher.bench_local(|| l.forward_with(black_box(&x), B, &mut y, Par::Seq, Gemm::Faer));
}

/// Writes a buffer larger than the last-level cache, as the embedding stage's gathers do between
/// two batches, so that the next call reads its weights from DRAM.
fn flush_caches() {
    thread_local! {
        static BIG: std::cell::RefCell<Vec<u64>> = std::cell::RefCell::new(vec![1; 8 << 20]);
    }
    BIG.with(|b| {
        for v in b.borrow_mut().iter_mut().step_by(8) {
            *v = v.wrapping_add(1);
        }
    });
}

/// Cold caches: the layer's weights and input evicted before each call.
#[divan::bench(args = SHAPES, sample_size = 1, sample_count = 200)]
fn ember_cold(bencher: Bencher, (i, o): (usize, usize)) {
    let l = layer(i, o);
    let x = normal_vec(64 * i, 1.0, 3);
    let mut y = vec![0f32; 64 * o];
    bencher
        .with_inputs(flush_caches)
        .bench_local_values(|()| l.forward_with(black_box(&x), 64, &mut y, Par::Seq, Gemm::Ember));
}

/// [`ember_cold`] on faer.
#[divan::bench(args = SHAPES, sample_size = 1, sample_count = 200)]
fn faer_cold(bencher: Bencher, (i, o): (usize, usize)) {
    let l = layer(i, o);
    let x = normal_vec(64 * i, 1.0, 3);
    let mut y = vec![0f32; 64 * o];
    bencher
        .with_inputs(flush_caches)
        .bench_local_values(|()| l.forward_with(black_box(&x), 64, &mut y, Par::Seq, Gemm::Faer));
}

/// RM1's dot interaction at batch 64: the bottom output and 32 pooled vectors of 64 per sample.
/// `EMBER_ISA=avx2` runs the faer path.
#[divan::bench]
fn dot_interaction(bencher: Bencher) {
    use ember_model::PairOrder;
    use ember_model::interaction::{Interaction, dot_pairs};
    let (batch, d, tables) = (64, 64, 32);
    let pairs = dot_pairs(tables + 1, false, PairOrder::Lower);
    let top_in = d + pairs.len();
    let it = Interaction::Dot { pairs, d };
    let x = normal_vec(batch * d, 1.0, 4);
    let pooled = normal_vec(batch * tables * d, 1.0, 5);
    let mut out = vec![0f32; batch * top_in];
    let mut scratch = Default::default();
    bencher.bench_local(|| {
        it.forward(
            black_box(&x),
            black_box(&pooled),
            batch,
            &mut out,
            &mut scratch,
            Par::Seq,
        )
    });
}
