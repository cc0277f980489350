//! `ember predict` on NumPy `.npz` and safetensors files of a model's input arrays: the same
//! scores as the same samples given as JSON lines (which `serve_cli` checks against the
//! server), whatever the integer and float widths; errors that name the array.

use crate::common;

use common::{ember, npy};
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The model's samples: dense rows, and per feature (name, lengths, ids); labels.
struct Samples {
    dense: Vec<Vec<f32>>,
    features: Vec<(String, Vec<i64>, Vec<i64>)>,
    labels: Vec<f32>,
}

fn samples(config: &serde_json::Value, n: usize) -> Samples {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let dense_in = config["dense_in"].as_u64().unwrap() as usize;
    let dense = (0..n)
        .map(|_| (0..dense_in).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect();
    let features = config["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let rows = t["rows"].as_u64().unwrap() as i64;
            // Empty bags included.
            let lengths: Vec<i64> = (0..n).map(|_| rng.random_range(0..4)).collect();
            let total: i64 = lengths.iter().sum();
            let ids = (0..total).map(|_| rng.random_range(0..rows)).collect();
            (t["name"].as_str().unwrap().to_string(), lengths, ids)
        })
        .collect();
    let labels = (0..n).map(|i| (i % 3 == 0) as u8 as f32).collect();
    Samples {
        dense,
        features,
        labels,
    }
}

fn jsonl(s: &Samples) -> String {
    let mut out = String::new();
    for (i, d) in s.dense.iter().enumerate() {
        let mut sparse = serde_json::Map::new();
        for (name, lengths, ids) in &s.features {
            let start: i64 = lengths[..i].iter().sum();
            let ids = &ids[start as usize..(start + lengths[i]) as usize];
            sparse.insert(name.clone(), serde_json::json!(ids));
        }
        let line = serde_json::json!({"dense": d, "sparse": sparse, "label": s.labels[i]});
        out.push_str(&format!("{line}\n"));
    }
    out
}

fn le<T: Copy, const W: usize>(v: &[T], f: impl Fn(T) -> [u8; W]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// `np.savez` (stored) or `np.savez_compressed` (deflated): dense as float64, lengths int32,
/// ids int64, labels int64.
fn write_npz(path: &Path, s: &Samples, compressed: bool, extra: Option<&str>) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let method = match compressed {
        true => zip::CompressionMethod::Deflated,
        false => zip::CompressionMethod::Stored,
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    let mut put = |name: &str, bytes: Vec<u8>| {
        z.start_file(format!("{name}.npy"), opts).unwrap();
        z.write_all(&bytes).unwrap();
    };
    let flat: Vec<f64> = s.dense.iter().flatten().map(|&x| x as f64).collect();
    let shape = [s.dense.len(), s.dense[0].len()];
    put("dense", npy("<f8", &shape, &le(&flat, f64::to_le_bytes)));
    for (name, lengths, ids) in &s.features {
        let l32: Vec<i32> = lengths.iter().map(|&l| l as i32).collect();
        put(
            &format!("{name}_lengths"),
            npy("<i4", &[l32.len()], &le(&l32, i32::to_le_bytes)),
        );
        put(
            &format!("{name}_ids"),
            npy("<i8", &[ids.len()], &le(ids, i64::to_le_bytes)),
        );
    }
    let labels: Vec<i64> = s.labels.iter().map(|&l| l as i64).collect();
    put(
        "label",
        npy("<i8", &[labels.len()], &le(&labels, i64::to_le_bytes)),
    );
    if let Some(name) = extra {
        put(name, npy("<f4", &[1], &1f32.to_le_bytes()));
    }
    z.finish().unwrap();
}

/// A safetensors file: dense float32, lengths int64, ids int32, labels float32.
fn write_safetensors(path: &Path, s: &Samples, skew: bool) {
    use safetensors::Dtype;
    use safetensors::tensor::TensorView;
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let flat: Vec<f32> = s.dense.iter().flatten().copied().collect();
    owned.push((
        "dense".into(),
        Dtype::F32,
        vec![s.dense.len(), s.dense[0].len()],
        le(&flat, f32::to_le_bytes),
    ));
    for (k, (name, lengths, ids)) in s.features.iter().enumerate() {
        let mut lengths = lengths.clone();
        if skew && k == 1 {
            lengths[0] += 1; // one more id than the ids array holds
        }
        owned.push((
            format!("{name}_lengths"),
            Dtype::I64,
            vec![lengths.len()],
            le(&lengths, i64::to_le_bytes),
        ));
        let i32s: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        owned.push((
            format!("{name}_ids"),
            Dtype::I32,
            vec![ids.len()],
            le(&i32s, i32::to_le_bytes),
        ));
    }
    owned.push((
        "label".into(),
        Dtype::F32,
        vec![s.labels.len()],
        le(&s.labels, f32::to_le_bytes),
    ));
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, shape, b)| (n.clone(), TensorView::new(*d, shape.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn scores(path: &Path) -> Vec<f32> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

fn predict(model: &str, data: &Path, out: &Path) -> (bool, String, String) {
    let (d, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    ember(&[
        "predict", "--model", model, "--data", d, "--batch", "4", "--out", o,
    ])
}

#[test]
fn predict_scores_npz_and_safetensors_as_json_lines() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("ember-predict-tensors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("small");
    let m = model.to_str().unwrap();
    let (ok, _, err) = ember(&[
        "data", "model", "--preset", "small", "--seed", "5", "--out", m,
    ]);
    assert!(ok, "{err}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    // 13 samples in batches of 4: the last batch is short.
    let s = samples(&config, 13);
    let lines = dir.join("s.jsonl");
    std::fs::write(&lines, jsonl(&s)).unwrap();
    let (ok, want_out, err) = predict(m, &lines, &dir.join("want.txt"));
    assert!(ok, "{err}");
    let want = scores(&dir.join("want.txt"));
    assert_eq!(want.len(), 13);
    let auc_line = |o: &str| {
        o.lines()
            .find(|l| l.starts_with("AUC"))
            .unwrap()
            .to_string()
    };
    for (name, write) in [
        (
            "stored.npz",
            &(|p: &Path| write_npz(p, &s, false, None)) as &dyn Fn(&Path),
        ),
        ("deflated.npz", &|p: &Path| write_npz(p, &s, true, None)),
        ("batch.safetensors", &|p: &Path| {
            write_safetensors(p, &s, false)
        }),
    ] {
        let data = dir.join(name);
        write(&data);
        let out = dir.join(format!("{name}.txt"));
        let (ok, stdout, err) = predict(m, &data, &out);
        assert!(ok, "{name}: {err}");
        assert!(stdout.contains("rows          13"), "{name}: {stdout}");
        assert_eq!(
            auc_line(&stdout),
            auc_line(&want_out),
            "{name}: labels read"
        );
        let got = scores(&out);
        assert_eq!(got.len(), want.len(), "{name}");
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6, "{name}: {g} vs json lines {w}");
        }
    }
    // Errors name the array and what is wrong.
    let bad = dir.join("extra.npz");
    write_npz(&bad, &s, false, Some("dense2"));
    let (ok, _, err) = predict(m, &bad, &dir.join("x.txt"));
    assert!(!ok && err.contains("unknown array 'dense2'"), "{err}");
    let bad = dir.join("skew.safetensors");
    write_safetensors(&bad, &s, true);
    let (ok, _, err) = predict(m, &bad, &dir.join("x.txt"));
    let f1 = &s.features[1].0;
    assert!(
        !ok && err.contains(&format!("'{f1}_lengths' add up to")),
        "{err}"
    );
    let (ok, _, err) = ember(&[
        "predict",
        "--model",
        m,
        "--data",
        lines.to_str().unwrap(),
        "--format",
        "npz",
    ]);
    assert!(!ok && err.contains("not a NumPy .npz"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ember predict --batch 1` of the shipped model on an `.npz` (stored) of `members` (name,
/// `.npy` bytes): it fails with an error, not a panic. Its stderr.
fn predict_crafted(name: &str, members: &[(String, Vec<u8>)]) -> String {
    let dir = std::env::temp_dir().join(format!("ember-predict-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("crafted.npz");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&data).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (n, bytes) in members {
        z.start_file(format!("{n}.npy"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    let (ok, _, err) = ember(&[
        "predict",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--batch",
        "1",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok && !err.contains("panicked"), "{err}");
    err
}

/// Found by the `npz` fuzz target (`fuzz/regressions/npz/`): an array whose size overflows
/// `usize` (2^62 x 13 float32 and no data; the byte count wrapped to 0) is refused naming it.
#[test]
fn npz_with_a_shape_whose_size_overflows_is_refused() {
    let dense = npy("<f4", &[1 << 62, 13], &[]);
    let err = predict_crafted("shape-overflow", &[("dense".into(), dense)]);
    assert!(
        err.contains("array 'dense': shape [4611686018427387904, 13] is too large"),
        "{err}"
    );
}

/// Found by the `npz` fuzz target (`fuzz/regressions/npz/`): lengths that add up past `usize`
/// (their sum wrapped to the one id there is: the file passed its check, and a batch of one
/// sample was cut past the file's end) are refused naming the array.
#[test]
fn npz_with_lengths_that_add_up_past_the_integers_is_refused() {
    let mut members = vec![("dense".to_string(), npy("<f4", &[3, 13], &[0; 3 * 13 * 4]))];
    for f in 1..=26 {
        let (lengths, ids) = match f {
            1 => (vec![i64::MAX, i64::MAX, 3], vec![5i64]),
            _ => (vec![0; 3], vec![]),
        };
        let lengths = npy("<i8", &[3], &le(&lengths, i64::to_le_bytes));
        members.push((format!("C{f}_lengths"), lengths));
        let ids = npy("<i8", &[ids.len()], &le(&ids, i64::to_le_bytes));
        members.push((format!("C{f}_ids"), ids));
    }
    let err = predict_crafted("lengths-overflow", &members);
    assert!(
        err.contains("'C1_lengths': the lengths up to sample 2 add up past"),
        "{err}"
    );
}
