//! Checked inputs: samples checked once and merged without a second check equal the batch built
//! and validated from their concatenation, and pool to the same output; every bad input is
//! refused naming the feature, sample and id; a batch checked against one collection is refused
//! by every other (the pooler, the sharded stage, the stager).

use ember_embed::*;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Three features over two tables (one shared), odd dims.
fn collection(rows: [usize; 2]) -> EmbeddingCollection {
    let mut rng = SmallRng::seed_from_u64(rows[0] as u64);
    let mut table = |name: &str, rows: usize, dim: usize| {
        let vals: Vec<f32> = (0..rows * dim)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        EmbeddingTable::from_f32(name, rows, dim, DType::F32, &vals).unwrap()
    };
    let tables = vec![table("a", rows[0], 5), table("b", rows[1], 3)];
    let features = ["x", "y", "z"]
        .iter()
        .zip([0, 1, 0])
        .map(|(n, table)| Feature {
            name: n.to_string(),
            table,
        })
        .collect();
    EmbeddingCollection::new(tables, features).unwrap()
}

/// `n` samples of random bags (empty ones included) over the collection's features, as a
/// request sends them: lengths and ids feature-major.
fn samples(rng: &mut SmallRng, coll: &EmbeddingCollection, n: usize) -> (Vec<u32>, Vec<i64>) {
    let (mut lengths, mut ids) = (Vec::new(), Vec::new());
    for f in 0..coll.features().len() {
        let rows = coll.table_of(f).rows();
        for _ in 0..n {
            let len = rng.random_range(0..4u32);
            lengths.push(len);
            ids.extend((0..len).map(|_| rng.random_range(0..rows as i64)));
        }
    }
    (lengths, ids)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn merged_samples_equal_the_validated_concatenation(
        seed in any::<u64>(),
        sizes in prop::collection::vec(0usize..5, 0..6),
    ) {
        let coll = collection([17, 9]);
        let mut rng = SmallRng::seed_from_u64(seed);
        let parts: Vec<(usize, Vec<u32>, Vec<i64>)> = sizes
            .iter()
            .map(|&n| {
                let (l, i) = samples(&mut rng, &coll, n);
                (n, l, i)
            })
            .collect();
        let checked: Vec<CheckedSamples> = parts
            .iter()
            .map(|(n, l, i)| coll.check_samples(*n, l.clone(), i.clone()).unwrap())
            .collect();
        let refs: Vec<&CheckedSamples> = checked.iter().collect();
        let merged = coll.merge(&refs).unwrap();
        // The same batch built the checked way: feature-major over every part's samples.
        let total: usize = sizes.iter().sum();
        let (mut lengths, mut ids) = (Vec::new(), Vec::new());
        for f in 0..3 {
            for (n, l, i) in &parts {
                let before: usize = l[..f * n].iter().map(|&x| x as usize).sum();
                let mine = &l[f * n..(f + 1) * n];
                let count: usize = mine.iter().map(|&x| x as usize).sum();
                lengths.extend(mine.iter().map(|&x| x as usize));
                ids.extend(i[before..before + count].iter().map(|&x| x as u32));
            }
        }
        let want = KeyedJagged::from_lengths(
            coll.feature_names(), total, &lengths, Ids::U32(ids), None).unwrap();
        prop_assert_eq!(merged.get(), &want);
        let pooler = Pooler::new(PoolOptions::default()).unwrap();
        let mut a = vec![f32::NAN; total * coll.total_dim()];
        let mut b = a.clone();
        pooler.run(&coll, merged.view(), &mut a).unwrap();
        pooler.run(&coll, coll.check_view(&want).unwrap(), &mut b).unwrap();
        prop_assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}

#[test]
fn bad_samples_are_refused_by_name() {
    let coll = collection([17, 9]);
    // Feature y reads table b (9 rows): sample 1's second id is 9.
    let lengths = vec![1, 0, 1, 2, 0, 0];
    let e = coll
        .check_samples(2, lengths.clone(), vec![16i64, 0, 3, 9])
        .unwrap_err();
    assert_eq!(
        e,
        EmbedError::IdOutOfRange {
            feature: "y".into(),
            sample: 1,
            id: 9,
            table: "b".into(),
            rows: 9
        }
    );
    // Negative ids are out of range too.
    let e = coll
        .check_samples(2, lengths.clone(), vec![-1i64, 0, 3, 8])
        .unwrap_err();
    assert!(
        matches!(
            e,
            EmbedError::IdOutOfRange {
                id: -1,
                sample: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = coll
        .check_samples(2, vec![1; 5], vec![0i64; 5])
        .unwrap_err();
    assert!(
        matches!(
            e,
            EmbedError::LengthsCount {
                got: 5,
                expected: 6,
                ..
            }
        ),
        "{e}"
    );
    let e = coll
        .check_samples(2, lengths.clone(), vec![0i64; 3])
        .unwrap_err();
    assert_eq!(e, EmbedError::LengthsSum { sum: 4, ids: 3 });
    // Zero samples are fine and merge into an empty batch.
    let none = coll.check_samples(0, vec![], Vec::<i64>::new()).unwrap();
    let b = coll.merge(&[&none]).unwrap();
    assert_eq!((b.batch_size(), b.get().num_ids()), (0, 0));
    assert_eq!(b.get().offsets(), &[0]);
}

#[test]
fn batches_of_another_collection_are_refused() {
    let a = collection([17, 9]);
    let b = collection([17, 9]);
    assert_ne!(a.id(), b.id());
    let kj = KeyedJagged::from_lengths(
        a.feature_names(),
        1,
        &[1, 1, 1],
        Ids::U32(vec![3, 4, 5]),
        None,
    )
    .unwrap();
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let mut out = vec![0f32; a.total_dim()];
    let e = pooler
        .run(&b, a.check_view(&kj).unwrap(), &mut out)
        .unwrap_err();
    assert_eq!(e, EmbedError::WrongCollection);
    pooler
        .run(&b, b.check_view(&kj).unwrap(), &mut out)
        .unwrap();
    let s = a.check_samples(1, vec![1, 1, 1], vec![3i64, 4, 5]).unwrap();
    assert_eq!(b.merge(&[&s]).unwrap_err(), EmbedError::WrongCollection);
    let shards: Vec<Shard> = (0..2)
        .map(|t| Shard {
            table: t,
            rows: (0, a.tables()[t].rows() as u64),
            cols: (0, a.tables()[t].dim() as u32),
            device: 0,
        })
        .collect();
    let sharded = ShardedEmbeddings::new(&a, &shards, PoolOptions::default()).unwrap();
    let e = sharded
        .run(b.check_view(&kj).unwrap(), &mut out)
        .unwrap_err();
    assert_eq!(e, EmbedError::WrongCollection);
    sharded.run(a.check_view(&kj).unwrap(), &mut out).unwrap();
}

#[test]
fn ids_are_kept_32_bit_whichever_width_they_came_in() {
    let coll = collection([17, 9]);
    assert!(coll.narrow_ids());
    let lengths = vec![1, 0, 1, 2, 0, 0];
    let wide = coll
        .check_samples(2, lengths.clone(), vec![16i64, 0, 3, 8])
        .unwrap();
    let narrow = coll
        .check_samples(2, lengths.clone(), vec![16u32, 0, 3, 8])
        .unwrap();
    assert_eq!(wide.ids(), &Ids::U32(vec![16, 0, 3, 8]));
    assert_eq!(wide, narrow);
    // Pushed one by one: 32-bit until an id does not fit, then 64-bit (and refused by name).
    let mut ids = Ids::with_capacity(true, 4);
    for x in [16, 0, 3] {
        ids.push(x);
    }
    assert!(matches!(ids, Ids::U32(_)));
    ids.push(1 << 40);
    assert_eq!(ids, Ids::I64(vec![16, 0, 3, 1 << 40]));
    let e = coll.check_samples(2, lengths, ids).unwrap_err();
    assert!(
        matches!(e, EmbedError::IdOutOfRange { id, sample: 1, .. } if id == 1 << 40),
        "{e}"
    );
    // Pieces keep the width.
    let pieces: Vec<_> = narrow.pieces(1).collect();
    assert_eq!(pieces[0].ids(), &Ids::U32(vec![16, 0]));
    assert_eq!(pieces[1].ids(), &Ids::U32(vec![3, 8]));
}

#[test]
fn one_id_per_bag_needs_no_lengths_and_checks_and_merges_alike() {
    let coll = collection([17, 9]);
    let mut rng = SmallRng::seed_from_u64(5);
    let n = 7;
    let ids: Vec<i64> = (0..3)
        .flat_map(|f| {
            let rows = coll.table_of(f).rows();
            (0..n)
                .map(|_| rng.random_range(0..rows as i64))
                .collect::<Vec<_>>()
        })
        .collect();
    let ones = coll.check_samples(n, Lengths::Ones, ids.clone()).unwrap();
    let each = coll
        .check_samples(n, vec![1u32; 3 * n], ids.clone())
        .unwrap();
    assert_eq!(ones.lengths(), each.lengths());
    let other = coll
        .check_samples(2, vec![1, 0, 2, 1, 0, 3], vec![1i64, 2, 3, 4, 5, 6, 7])
        .unwrap();
    // Merged with others and cut into pieces, it is what the explicit lengths give.
    assert_eq!(
        coll.merge(&[&other, &ones, &other]).unwrap(),
        coll.merge(&[&other, &each, &other]).unwrap()
    );
    for max in [1, 3, 7, 10] {
        let a: Vec<_> = ones
            .pieces(max)
            .map(|p| coll.merge(&[&p]).unwrap())
            .collect();
        let b: Vec<_> = each
            .pieces(max)
            .map(|p| coll.merge(&[&p]).unwrap())
            .collect();
        assert_eq!(a, b, "max {max}");
    }
    // Errors name the sample as with explicit lengths.
    let mut bad = ids.clone();
    bad[n + 4] = 9; // feature y (table b, 9 rows), sample 4
    let e = coll
        .check_samples(n, Lengths::Ones, bad.clone())
        .unwrap_err();
    assert_eq!(
        e,
        coll.check_samples(n, vec![1u32; 3 * n], bad).unwrap_err()
    );
    assert!(
        matches!(
            e,
            EmbedError::IdOutOfRange {
                sample: 4,
                id: 9,
                ..
            }
        ),
        "{e}"
    );
    let e = coll
        .check_samples(n, Lengths::Ones, vec![0i64; 5])
        .unwrap_err();
    assert_eq!(e, EmbedError::LengthsSum { sum: 21, ids: 5 });
}
