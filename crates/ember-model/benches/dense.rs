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
