//! The seam a server uses: requests checked one by one and merged score exactly as the same
//! samples checked as one batch; a request's bad input is refused naming the input, the sample
//! and the value (the messages the server sends back); a batch of one model is refused by
//! another; tier rows are staged by `prepare`, and inline staging is counted in the times.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ember_embed::EmbedError;
use ember_model::{Engine, ErrorKind, LoadOptions, Model, ModelError, Predictor, Samples};
use ember_model::{Ids, KeyedJagged};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load(dir: &Path) -> Arc<Model> {
    Arc::new(Model::load(dir, LoadOptions::default()).unwrap())
}

/// A request as sent: samples, dense values, lengths and ids (feature-major).
type Request = (usize, Vec<f32>, Vec<u32>, Vec<i64>);

/// `n` random samples of `model` as a request sends them: dense `[n, dense_in]`, lengths and
/// ids feature-major (empty bags included).
fn request(model: &Model, n: usize, rng: &mut StdRng) -> (Vec<f32>, Vec<u32>, Vec<i64>) {
    let inputs = model.inputs();
    let dense = (0..n * inputs.dense_in)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    let (mut lengths, mut ids) = (Vec::new(), Vec::new());
    for &rows in &inputs.rows {
        for _ in 0..n {
            let l = rng.random_range(0..4u32);
            lengths.push(l);
            ids.extend((0..l).map(|_| rng.random_range(0..rows as i64)));
        }
    }
    (dense, lengths, ids)
}

/// The same samples as one batch, feature-major over every request in order.
fn concatenate(model: &Model, parts: &[Request]) -> (Vec<f32>, KeyedJagged) {
    let nf = model.inputs().features.len();
    let n: usize = parts.iter().map(|p| p.0).sum();
    let mut dense = Vec::new();
    parts.iter().for_each(|p| dense.extend_from_slice(&p.1));
    let (mut lengths, mut ids) = (Vec::new(), Vec::new());
    for f in 0..nf {
        for (k, _, l, i) in parts {
            let before: usize = l[..f * k].iter().map(|&x| x as usize).sum();
            let mine = &l[f * k..(f + 1) * k];
            let count: usize = mine.iter().map(|&x| x as usize).sum();
            lengths.extend(mine.iter().map(|&x| x as usize));
            ids.extend_from_slice(&i[before..before + count]);
        }
    }
    let kj = KeyedJagged::from_lengths(model.inputs().features, n, &lengths, Ids::I64(ids), None)
        .unwrap();
    (dense, kj)
}

#[test]
fn merged_requests_score_like_one_checked_batch() {
    for name in ["dlrm_dot", "torchrec_dcn", "dlrm_dot_int8"] {
        let model = load(&fixture(name));
        let mut rng = StdRng::seed_from_u64(7);
        let parts: Vec<_> = [1usize, 3, 0, 2, 5]
            .iter()
            .map(|&n| {
                let (d, l, i) = request(&model, n, &mut rng);
                (n, d, l, i)
            })
            .collect();
        let checked: Vec<Samples> = parts
            .iter()
            .map(|(n, d, l, i)| {
                model
                    .check_samples(*n, d.clone(), l.clone(), i.clone())
                    .unwrap()
            })
            .collect();
        let refs: Vec<&Samples> = checked.iter().collect();
        let merged = model.prepare(model.merge(&refs).unwrap()).unwrap();
        assert_eq!(merged.len(), 11);
        assert!(merged.staged().is_none(), "no table is on the tier");
        let mut p = Predictor::new(model.clone(), 1).unwrap();
        let mut got = vec![f32::NAN; 11];
        p.run(&merged, &mut got).unwrap();
        let (dense, kj) = concatenate(&model, &parts);
        let mut want = vec![f32::NAN; 11];
        p.score(&dense, &kj, &mut want).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: {got:?} vs {want:?}"
        );
        // The merged batch carries the samples as sent.
        assert_eq!(merged.batch().dense(), &dense[..]);
        assert_eq!(merged.batch().sparse().offsets(), kj.offsets());
    }
}

#[test]
fn a_request_in_pieces_is_the_request() {
    for name in ["dlrm_dot", "torchrec_dcn"] {
        let model = load(&fixture(name));
        let mut rng = StdRng::seed_from_u64(11);
        for n in [0usize, 1, 7, 16, 37] {
            let (d, l, i) = request(&model, n, &mut rng);
            let whole = model.check_samples(n, d, l, i).unwrap();
            for max in [1usize, 5, 16, 100] {
                let pieces: Vec<Samples> = whole.pieces(max).collect();
                assert_eq!(pieces.len(), n.div_ceil(max), "{name} n={n} max={max}");
                assert!(pieces.iter().all(|p| (1..=max).contains(&p.len())));
                // Merged back, the pieces are the request.
                let refs: Vec<&Samples> = pieces.iter().collect();
                let again = model.merge(&refs).unwrap();
                let once = model.merge(&[&whole]).unwrap();
                assert_eq!(again.len(), n);
                assert_eq!(again.dense(), once.dense(), "{name} n={n} max={max}");
                assert_eq!(again.sparse().offsets(), once.sparse().offsets());
                assert_eq!(again.sparse().ids(), once.sparse().ids());
            }
        }
    }
}

#[test]
fn request_errors_name_the_input_the_sample_and_the_value() {
    let model = load(&fixture("dlrm_dot"));
    // C1 reads t0 (7 rows), C2 t1 (130), C3 t2 (1000), C4 t3 (33); 13 dense features.
    let dense = vec![0.5f32; 2 * 13];
    let ok_lengths = vec![1, 0, 0, 1, 1, 1, 0, 2];
    let ok_ids = vec![6, 129, 0, 999, 32, 0];
    model
        .check_samples(2, dense.clone(), ok_lengths.clone(), ok_ids.clone())
        .unwrap();
    // Dense values, lengths, ids, and the message they must get.
    type Case = (Vec<f32>, Vec<u32>, Vec<i64>, String);
    let cases: Vec<Case> = vec![
        (
            dense[1..].to_vec(),
            ok_lengths.clone(),
            ok_ids.clone(),
            "dense has 25 values; 2 samples of 13 dense features need 26".into(),
        ),
        (
            {
                let mut d = dense.clone();
                d[15] = f32::INFINITY;
                d
            },
            ok_lengths.clone(),
            ok_ids.clone(),
            "dense feature 2 of sample 1 is inf (must be finite)".into(),
        ),
        (
            dense.clone(),
            ok_lengths[1..].to_vec(),
            ok_ids.clone(),
            "7 lengths for 2 samples of 4 sparse features (need 8)".into(),
        ),
        (
            dense.clone(),
            ok_lengths.clone(),
            ok_ids[1..].to_vec(),
            "the lengths add up to 6 ids but 5 ids were sent".into(),
        ),
        (
            dense.clone(),
            ok_lengths.clone(),
            vec![6, 129, 0, 1000, 32, 0],
            "C3: id 1000 of sample 1 is out of range (the table has 1000 rows)".into(),
        ),
        (
            dense.clone(),
            ok_lengths.clone(),
            vec![-1, 129, 0, 999, 32, 0],
            "C1: id -1 of sample 0 is out of range (the table has 7 rows)".into(),
        ),
    ];
    for (d, l, i, want) in cases {
        let e = model.check_samples(2, d, l, i).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert_eq!(e.message(), want);
        assert_eq!(e.to_string(), format!("bad input: {want}"));
    }
}

#[test]
fn errors_say_who_is_at_fault() {
    let input = ModelError::from(EmbedError::IdOutOfRange {
        feature: "f".into(),
        sample: 0,
        id: 9,
        table: "t".into(),
        rows: 3,
    });
    assert_eq!(input.kind(), ErrorKind::Input);
    let corrupt = ModelError::from(EmbedError::Corrupt {
        path: "t.rows".into(),
        block: 2,
        offset: 8192,
        len: 4096,
        stored: 1,
        actual: 2,
    });
    assert_eq!(corrupt.kind(), ErrorKind::Internal);
    assert!(
        corrupt.message().contains("t.rows"),
        "{}",
        corrupt.message()
    );
    let device = ModelError::Device {
        device: "cuda:0".into(),
        source: std::io::Error::other("launch failed").into(),
    };
    assert_eq!(device.kind(), ErrorKind::Internal);
    assert_eq!(device.to_string(), "cuda:0: launch failed");
    assert_eq!(
        ModelError::from(EmbedError::WrongCollection).kind(),
        ErrorKind::Internal
    );
}

#[test]
fn a_batch_of_one_model_is_refused_by_another() {
    let a = load(&fixture("dlrm_dot"));
    let b = load(&fixture("dlrm_dot"));
    let mut rng = StdRng::seed_from_u64(3);
    let (d, l, i) = request(&a, 2, &mut rng);
    let s = a.check_samples(2, d, l, i).unwrap();
    assert!(b.merge(&[&s]).is_err(), "samples of another model merged");
    let batch = a.prepare(a.merge(&[&s]).unwrap()).unwrap();
    let mut pb = Predictor::new(b.clone(), 1).unwrap();
    let e = pb.run(&batch, &mut [0.0; 2]).unwrap_err();
    assert!(
        matches!(e, ModelError::Embed(EmbedError::WrongCollection)),
        "{e}"
    );
    // Its own model runs it, and `b` still runs its own batches.
    Predictor::new(a, 1)
        .unwrap()
        .run(&batch, &mut [0.0; 2])
        .unwrap();
    let (d, l, i) = request(&b, 2, &mut rng);
    let own = b.check_samples(2, d, l, i).unwrap();
    pb.run(
        &b.prepare(b.merge(&[&own]).unwrap()).unwrap(),
        &mut [0.0; 2],
    )
    .unwrap();
}

#[test]
fn prepare_stages_tier_rows_and_inline_staging_is_counted() {
    use ember_embed::Placement;
    use ember_embed::rowfile::write_row_file;
    use ember_model::weights::row_file_path;
    let tmp = std::env::temp_dir().join(format!("ember-seam-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("rows")).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("dlrm_dot").join(f), tmp.join(f)).unwrap();
    }
    let dram = load(&tmp);
    for t in dram.embeddings().tables() {
        let path = row_file_path(&tmp, t.name());
        write_row_file(
            &path,
            t.name(),
            t.rows(),
            t.dim(),
            t.dtype(),
            t.resident().unwrap(),
        )
        .unwrap();
    }
    let ssd = Arc::new(
        Model::load(
            &tmp,
            LoadOptions {
                placement: Some(Placement::Ssd),
                ..LoadOptions::default()
            },
        )
        .unwrap(),
    );
    assert!(ssd.prefetch_depth() >= 1 && dram.prefetch_depth() == 0);
    let mut rng = StdRng::seed_from_u64(11);
    let (d, l, i) = request(&ssd, 4, &mut rng);
    let s = ssd
        .check_samples(4, d.clone(), l.clone(), i.clone())
        .unwrap();
    let prepared = ssd.prepare(ssd.merge(&[&s]).unwrap()).unwrap();
    assert!(prepared.staged().is_some_and(|st| st.bytes() > 0));
    let (mut got, mut want) = (vec![f32::NAN; 4], vec![f32::NAN; 4]);
    let mut p = Predictor::new(ssd.clone(), 1).unwrap();
    let times = p.run(&prepared, &mut got).unwrap();
    let inline = ssd.staged_inline(&prepared, times);
    assert_eq!(inline.embedding, times.embedding + prepared.staging_time());
    assert_eq!(ssd.stager().stats().stall, prepared.staging_time());
    let s = dram.check_samples(4, d, l, i).unwrap();
    let batch = dram.prepare(dram.merge(&[&s]).unwrap()).unwrap();
    Predictor::new(dram.clone(), 1)
        .unwrap()
        .run(&batch, &mut want)
        .unwrap();
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `check_dense_into` (a GPU's one-pass check and copy) accepts and refuses what `Model::batch`
/// does, with the same message, and copies every value it accepts.
#[test]
fn dense_checked_into_a_buffer_agrees_with_the_batch_check() {
    let p = ember_model::presets::preset("small", ember_embed::DType::F32).unwrap();
    let model = Model::random(p.config.clone(), 3, 1).unwrap();
    let n = model.config().dense_in;
    let mut rng = StdRng::seed_from_u64(5);
    // Below and above the size from which the copy is split across threads.
    for batch in [0usize, 1, 7, ember_embed::PARALLEL_CHECK_IDS / n + 3] {
        let (mut dense, kj) =
            ember_model::presets::random_batch(&model.config().clone(), batch, 2, 9);
        for case in 0..4 {
            let mut d = dense.clone();
            match case {
                1 if !d.is_empty() => {
                    let at = rng.random_range(0..d.len());
                    d[at] = f32::NAN;
                }
                2 => d.push(1.0), // not a whole sample
                3 if !d.is_empty() => {
                    d[0] = f32::INFINITY;
                    let last = d.len() - 1;
                    d[last] = f32::NEG_INFINITY;
                }
                _ => {}
            }
            let mut dst = vec![0f32; d.len()];
            let fused = model.check_dense_into(&d, batch, &mut dst);
            let plain = model.batch(&d, &kj).map(|_| ());
            assert_eq!(
                fused.as_ref().map_err(|e| e.to_string()),
                plain.as_ref().map_err(|e| e.to_string()),
                "batch {batch} case {case}"
            );
            if plain.is_ok() {
                assert_eq!(dst, d, "batch {batch} case {case}");
            }
        }
        let mut short = vec![0f32; dense.len() + 1];
        assert!(model.check_dense_into(&dense, batch, &mut short).is_err());
        dense.clear();
    }
}
