//! A graph model's forward pass on the CPU predictor: the embedding stage pools each sample's
//! features into one row, then the graph runs on those rows and the dense features
//! (`docs/graph-models.md`).

use std::time::Instant;

use ember_embed::EmbedError;

use super::{Embed, Predictor, check_out};
use crate::engine::StageTimes;
use crate::error::{ModelError, Result};
use crate::inputs::Prepared;
use crate::outputs::Outputs;

impl Predictor {
    /// A graph model's forward pass: the embedding stage pools each sample's features into one
    /// row, then the graph runs on those rows and the dense features, every output into `out`.
    pub(super) fn forward_graph(
        &mut self,
        batch: &Prepared<'_>,
        out: &mut Outputs,
    ) -> Result<StageTimes> {
        let b = batch.batch();
        if b.valid().collection() != self.model.embeddings().id() {
            return Err(EmbedError::WrongCollection.into());
        }
        let m = &*self.model;
        let Some(graph) = m.graph() else {
            return Err(ModelError::Input("not a graph model".into()));
        };
        let outputs = graph.outputs().len();
        out.reset(outputs);
        let w = crate::graph::Widths {
            n: b.len(),
            dense: m.dense_width(),
            sparse: m.embeddings().total_dim(),
        };
        let embed = Embed {
            pooler: &self.pooler,
            sharded: self.sharded.as_ref(),
            coll: m.embeddings(),
            valid: b.valid(),
            staged: batch.staged(),
        };
        let (dense_p, threads) = (self.dense, self.threads);
        let mut t = StageTimes::default();
        let start = Instant::now();
        self.pooler.install(|| -> Result<()> {
            let mut pooled = crate::graph::pooled_buffer(w.n * w.sparse);
            embed.pool(&mut pooled)?;
            t.embedding = start.elapsed();
            let t1 = Instant::now();
            crate::graph::model_run(
                graph,
                dense_p,
                b.dense(),
                pooled,
                w,
                threads,
                &mut out.values,
            )
            .map_err(|e| ModelError::Input(format!("the dense graph: {e}")))?;
            t.graph = t1.elapsed();
            Ok(())
        })?;
        t.wall = start.elapsed();
        Ok(t)
    }

    /// [`crate::Engine::run`] of a graph model of one output: that output, as the graph gives
    /// it; a model of several is refused (`run_outputs` gives them).
    pub(super) fn run_graph_one(
        &mut self,
        batch: &Prepared<'_>,
        scores: &mut [f32],
    ) -> Result<StageTimes> {
        let names = self.model.config().output_names();
        if names.len() != 1 {
            return Err(ModelError::Input(format!(
                "the model gives {} outputs ({}): run_outputs",
                names.len(),
                names.join(", ")
            )));
        }
        check_out(scores, batch.len())?;
        let mut out = Outputs::default();
        let t = self.forward_graph(batch, &mut out)?;
        scores.copy_from_slice(&out.values[0]);
        Ok(t)
    }
}
