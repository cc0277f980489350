//! A graph model (`"family": "graph"`, written by `tools/export_torch.py --from torch-module`):
//! its tables pooled by Ember's embedding stage into one row per sample (every feature's pooled
//! embedding side by side, the layout the graph's `sparse` input takes), then its dense part,
//! `dense.onnx`, on the graph runtime; one score per sample for each output. This is the whole
//! model from ids to scores, checked at load; the serving seam does not take it yet
//! (`docs/graph-models.md`).

use std::collections::HashMap;
use std::path::Path;

use ember_embed::{Dedup, EmbeddingCollection, Feature, KeyedJagged, PoolOptions, Pooler};
use serde::{Deserialize, Serialize};

use super::{Graph, Tensor};
use crate::config::{FeatureConfig, PoolingName, TableConfig, read_config_text, safe_file_name};
use crate::dense::DenseDType;
use crate::error::{ModelError, Result};
use crate::weights::{Pace, Reader, map_weights};

/// `format` of a graph model's config.json.
pub const FORMAT: &str = "ember-graph";

/// A graph model's config.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphModelConfig {
    pub format: String,
    pub format_version: u32,
    pub family: String,
    pub dense_in: usize,
    pub tables: Vec<TableConfig>,
    pub features: Vec<FeatureConfig>,
    #[serde(default)]
    pub pooling: PoolingName,
    pub graph: GraphSpec,
    /// The linear layers' precision (`--dense-dtype` overrides it).
    #[serde(default, skip_serializing_if = "DenseDType::is_f32")]
    pub dense_dtype: DenseDType,
}

/// Where the dense part is and what it gives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphSpec {
    /// The ONNX file, in the model directory.
    pub file: String,
    /// The graph's outputs, in order: one score per sample each.
    pub outputs: Vec<String>,
}

/// A graph model, loaded and checked.
#[derive(Debug)]
pub struct GraphModel {
    config: GraphModelConfig,
    embeddings: EmbeddingCollection,
    pooler: Pooler,
    graph: Graph,
}

impl GraphModel {
    /// Loads `dir` (config.json, model.safetensors, the graph): tables in DRAM, pooled on
    /// `threads` threads.
    pub fn load(dir: &Path, threads: usize) -> Result<GraphModel> {
        let path = dir.join("config.json");
        let bad = |reason: String| ModelError::Config {
            path: path.clone(),
            reason,
        };
        let config = GraphModelConfig::read(&path)?;
        let weights = dir.join("model.safetensors");
        let map = map_weights(&weights)?;
        let mut r = Reader::new(&weights, &map)?;
        let tables = r.tables(&map, &config.tables, None, None, Pace::default())?;
        r.check_all_used()?;
        let index: HashMap<&str, usize> = config
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let features = config
            .features
            .iter()
            .map(|f| Feature {
                name: f.name.clone(),
                table: index[f.table.as_str()],
            })
            .collect();
        let embeddings = EmbeddingCollection::new(tables, features)?;
        let mut graph = Graph::load(&dir.join(&config.graph.file))
            .map_err(|e| bad(format!("{}: {e}", config.graph.file)))?;
        graph.set_dense_dtype(config.dense_dtype)?;
        let pooler = Pooler::new(PoolOptions {
            pooling: config.pooling.into(),
            dedup: Dedup::Auto,
            threads,
            ..PoolOptions::default()
        })?;
        let m = GraphModel {
            config,
            embeddings,
            pooler,
            graph,
        };
        m.check_graph().map_err(bad)?;
        Ok(m)
    }

    /// The graph takes what the tables and the dense width give, and gives what the config
    /// names: its inputs are `dense` and / or `sparse`, its outputs the config's, and batches
    /// of 1 and 2 zeros run to one score per sample for each output.
    fn check_graph(&self) -> std::result::Result<(), String> {
        let inputs = self.graph.inputs();
        if let Some(other) = inputs.iter().find(|n| !["dense", "sparse"].contains(n)) {
            return Err(format!(
                "the graph takes an input {other:?}; a graph model's inputs are \"dense\" (the \
                 dense features) and \"sparse\" (the pooled embeddings)"
            ));
        }
        if self.graph.outputs() != self.config.graph.outputs {
            return Err(format!(
                "the graph gives {:?}; config.json names {:?}",
                self.graph.outputs(),
                self.config.graph.outputs
            ));
        }
        for n in [1, 2] {
            let dense = vec![0.0; n * self.config.dense_in];
            let sparse = vec![0.0; n * self.embeddings.total_dim()];
            let outs = self.run_dense(&dense, sparse, n, 1).map_err(|e| {
                format!(
                    "the graph does not run on dense [{n}, {}] and the tables' pooled rows \
                     [{n}, {}]: {e}",
                    self.config.dense_in,
                    self.embeddings.total_dim()
                )
            })?;
            for (name, o) in self.config.graph.outputs.iter().zip(&outs) {
                if o.len() != n {
                    return Err(format!(
                        "output {name:?} gives {} values for {n} samples; each output must be \
                         one score per sample",
                        o.len()
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn config(&self) -> &GraphModelConfig {
        &self.config
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn embeddings(&self) -> &EmbeddingCollection {
        &self.embeddings
    }

    pub fn set_dense_dtype(&mut self, dtype: DenseDType) -> Result<()> {
        self.graph.set_dense_dtype(dtype)
    }

    /// Scores a batch: `dense` (`[n, dense_in]`) and its ids (the config's features in
    /// order): per output, one score per sample. Every id is checked against its table first.
    pub fn score(
        &self,
        dense: &[f32],
        sparse: &KeyedJagged,
        threads: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let n = sparse.batch_size();
        if dense.len() != n * self.config.dense_in {
            return Err(ModelError::Input(format!(
                "{} dense values for {n} samples of {} features",
                dense.len(),
                self.config.dense_in
            )));
        }
        let view = self.embeddings.check_view(sparse)?;
        // The pooled rows in a buffer of the thread's pool (`pool.rs`: no page faults).
        let mut pooled = super::pool::zeros(n * self.embeddings.total_dim());
        self.pooler.run(&self.embeddings, view, &mut pooled)?;
        self.run_dense(dense, pooled, n, threads)
            .map_err(|e| ModelError::Input(format!("the dense graph: {e}")))
    }

    /// The graph on a batch's dense features and pooled rows.
    fn run_dense(
        &self,
        dense: &[f32],
        pooled: Vec<f32>,
        n: usize,
        threads: usize,
    ) -> std::result::Result<Vec<Vec<f32>>, String> {
        let mut dv = super::pool::take(dense.len());
        dv.extend_from_slice(dense);
        let d = Tensor::f32(vec![n, self.config.dense_in], dv)?;
        let s = Tensor::f32(vec![n, self.embeddings.total_dim()], pooled)?;
        let inputs: Vec<(&str, &Tensor)> = [("dense", &d), ("sparse", &s)]
            .into_iter()
            .filter(|(name, _)| self.graph.inputs().contains(name))
            .collect();
        let outs = self.graph.run(&inputs, threads).map_err(|e| e.to_string());
        for t in [d, s] {
            if let super::tensor::Data::F32(v) = t.data {
                super::pool::give(v);
            }
        }
        let outs = outs?;
        outs.into_iter()
            .map(|t| match t.as_f32() {
                Some(v) => Ok(v.to_vec()),
                None => Err(format!("an output is {}, not float", t.kind())),
            })
            .collect()
    }
}

impl GraphModelConfig {
    /// Reads and checks the config at `path`.
    pub fn read(path: &Path) -> Result<GraphModelConfig> {
        let text = read_config_text(path)?;
        let config: GraphModelConfig =
            serde_json::from_str(&text).map_err(|source| ModelError::ConfigJson {
                path: path.into(),
                source,
            })?;
        config.check().map_err(|reason| ModelError::Config {
            path: path.into(),
            reason,
        })?;
        Ok(config)
    }

    /// The width of a sample's pooled row, the graph's `sparse` input: its features' table
    /// dims added up (`check` has made sure every feature's table exists).
    pub fn sparse_width(&self) -> usize {
        let dims: HashMap<&str, usize> = self
            .tables
            .iter()
            .map(|t| (t.name.as_str(), t.dim))
            .collect();
        self.features.iter().map(|f| dims[f.table.as_str()]).sum()
    }

    /// What load needs before it reads anything.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.format != FORMAT || self.format_version != 1 || self.family != "graph" {
            return Err(format!(
                "format {:?} version {}, family {:?}: this build reads {FORMAT:?} version 1, \
                 family \"graph\"",
                self.format, self.format_version, self.family
            ));
        }
        if !safe_file_name(&self.graph.file) {
            return Err(format!(
                "graph.file {:?} is not a file name",
                self.graph.file
            ));
        }
        if self.graph.outputs.is_empty() {
            return Err("graph.outputs is empty".into());
        }
        let names: std::collections::HashSet<&str> =
            self.tables.iter().map(|t| t.name.as_str()).collect();
        if let Some(f) = self
            .features
            .iter()
            .find(|f| !names.contains(f.table.as_str()))
        {
            return Err(format!(
                "feature {:?} reads unknown table {:?}",
                f.name, f.table
            ));
        }
        if self.features.is_empty() {
            return Err("no features".into());
        }
        Ok(())
    }
}
