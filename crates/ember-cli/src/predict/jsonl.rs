//! `ember predict` on JSON lines, for a model of any family: one item a line, as `/v1/score`
//! takes it (`ember_serve::v1::decode_json_any`): a DLRM sample `{"dense": [...], "sparse":
//! {"F": [ids]}, "label": 0}` (the label optional), an HSTU user `{"uih": {feature: [values]},
//! "candidates": {feature: [values]}}` keyed by the model's own feature names. Each line is
//! decoded and checked by the model's signature, so a bad line stops the run with an error that
//! names its line (and the item as that number) and the input; items are merged into batches
//! of at most `--batch` items and the model's [`Servable::max_batch_weight`] (an HSTU batch's
//! tokens). Output (`--out`), one line per item in input order: its score where the model
//! gives one value per item, else `{"scores": {output: [its values]}}` (an HSTU task's scores,
//! one per candidate).

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ember_model::serving::{Items, Outputs, Request, Runner, Servable, Signature};
use ember_serve::ModelSpec;
use serde_json::json;

use super::{PredictArgs, Scored, open_data, open_out, run_batch};

/// Scores the JSON lines of `data` with `runner`'s model (see the module documentation).
pub(super) fn score(
    a: &PredictArgs,
    spec: &ModelSpec,
    runner: &mut dyn Runner,
    data: &Path,
) -> Result<Scored> {
    let (input, _) = open_data(data)?;
    let model = spec.servable().clone();
    let item = spec.signature.item;
    let budget = model.max_batch_weight();
    let mut b = Pending {
        pending: Vec::with_capacity(a.batch.min(4096)),
        weight: 0,
        outputs: Outputs::default(),
        out: open_out(a)?,
        scored: Scored::default(),
    };
    let (mut labelled, mut unlabelled) = (0usize, 0usize);
    let start = Instant::now();
    for (i, line) in input.lines().enumerate() {
        let at = || format!("{}, line {}", data.display(), i + 1);
        let line = line.with_context(at)?;
        if line.trim().is_empty() {
            continue;
        }
        let (body, label) = split_label(&line).with_context(at)?;
        match label {
            Some(l) => {
                labelled += 1;
                b.scored.labels.push(l);
            }
            None => unlabelled += 1,
        }
        let request = ember_serve::v1::decode_json_any(spec, body.as_bytes()).map_err(|e| {
            // The line is the request's item 0: say which item of the file it is.
            let msg = e
                .to_string()
                .replacen(&format!("{item} 0"), &format!("{item} {}", i + 1), 1);
            anyhow::anyhow!("{}: {msg}", at())
        })?;
        if request.len() != 1 {
            bail!("{}: one {item} a line, found {}", at(), request.len());
        }
        let w = request.weight();
        if !b.pending.is_empty() && (b.pending.len() >= a.batch || b.weight + w > budget) {
            b.flush(&*model, runner, &spec.signature)?;
        }
        b.weight += w;
        b.pending.push(request);
    }
    b.flush(&*model, runner, &spec.signature)?;
    if labelled > 0 && unlabelled > 0 {
        bail!("{labelled} lines have a 'label' and {unlabelled} do not: all or none");
    }
    if labelled > 0 && !spec.signature.one_value_per_item() {
        bail!("a 'label' is one number per {item}, for a model that gives one score per {item}");
    }
    let mut scored = b.scored;
    scored.wall = start.elapsed().as_secs_f64();
    if let Some(mut w) = b.out {
        w.flush()?;
    }
    Ok(scored)
}

/// Items read and not yet scored, and what scoring gave so far.
struct Pending {
    pending: Vec<Request>,
    /// Their [`Items::weight`].
    weight: usize,
    outputs: Outputs,
    out: Option<BufWriter<std::fs::File>>,
    scored: Scored,
}

impl Pending {
    /// Scores the pending items as one batch.
    fn flush(
        &mut self,
        model: &dyn Servable,
        runner: &mut dyn Runner,
        sig: &Signature,
    ) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let parts: Vec<&dyn Items> = self.pending.iter().map(|r| &**r).collect();
        let batch = model.prepare(&parts)?;
        run_batch(
            runner,
            &batch,
            &mut self.outputs,
            &mut self.scored,
            &mut self.out,
            sig,
        )?;
        self.pending.clear();
        self.weight = 0;
        Ok(())
    }
}

/// A line without its `label` (a number), and the label. Only a line that mentions one is
/// parsed twice.
fn split_label(line: &str) -> Result<(std::borrow::Cow<'_, str>, Option<f32>)> {
    if !line.contains("\"label\"") {
        return Ok((line.into(), None));
    }
    let mut v: serde_json::Value = serde_json::from_str(line).context("not a JSON object")?;
    let Some(label) = v.as_object_mut().and_then(|o| o.remove("label")) else {
        return Ok((line.into(), None));
    };
    let Some(l) = label.as_f64() else {
        bail!("'label' is not a number");
    };
    Ok((v.to_string().into(), Some(l as f32)))
}

/// Writes each item of `o`, one line each: its value where the model gives one value per item
/// (a score), else `{"scores": {output: value or [its values]}}`.
pub(super) fn write_outputs(w: &mut dyn Write, o: &Outputs, sig: &Signature) -> Result<()> {
    if sig.one_value_per_item() {
        for s in o.scores() {
            writeln!(w, "{s}")?;
        }
        return Ok(());
    }
    let offsets = o.offsets();
    for (i, span) in offsets.windows(2).enumerate() {
        let (lo, hi) = (span[0] as usize, span[1] as usize);
        let obj: serde_json::Map<String, serde_json::Value> = sig
            .outputs
            .iter()
            .zip(&o.values)
            .map(|(name, v)| {
                let value = match sig.offsets {
                    Some(_) => json!(v[lo..hi]),
                    None => json!(v[i]),
                };
                (name.clone(), value)
            })
            .collect();
        writeln!(w, "{}", json!({ "scores": obj }))?;
    }
    Ok(())
}
