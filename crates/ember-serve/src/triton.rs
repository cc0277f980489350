//! Triton's model configuration and statistics extensions, in one form for both protocols: the
//! configuration of a served version as a typed value, written as HTTP's JSON or gRPC's
//! `ModelConfig` message, and the statistics as gRPC's message (HTTP serializes them directly).

use serde_json::{Value, json};

use crate::kserve;
use crate::proto::pb;
use crate::repo::Served;

/// One input or output of a model's configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConfigTensor {
    pub name: String,
    /// The protocol's datatype (`FP32`, `INT64`): Triton's config writes it `TYPE_FP32`.
    pub datatype: &'static str,
    /// Without the batch dimension; `-1` for any size.
    pub dims: Vec<i64>,
}

/// Triton's model configuration of a served version.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelConfig {
    pub name: String,
    pub version: u64,
    pub max_batch_size: usize,
    pub max_queue_delay_us: u64,
    pub input: Vec<ConfigTensor>,
    pub output: Vec<ConfigTensor>,
    /// Triton's `parameters`: the dense layers' precision and kernels.
    pub parameters: Vec<(&'static str, String)>,
}

/// The configuration of `s`: its inputs and output (dims without the batch dimension; a
/// feature's `_ids` are all of a batch's ids, so `-1`), the batcher's limits as
/// `max_batch_size` and `dynamic_batching`.
pub(crate) fn config(s: &Served) -> ModelConfig {
    let meta = kserve::metadata(&s.spec, &s.version_str);
    let tensor = |t: &kserve::TensorMeta| ConfigTensor {
        name: t.name.clone(),
        datatype: t.datatype,
        dims: match t.shape.as_slice() {
            [_, rest @ ..] if !rest.is_empty() => rest.to_vec(),
            _ if t.name.ends_with("_lengths") => vec![1],
            _ => vec![-1],
        },
    };
    let cfg = s.batcher.config();
    ModelConfig {
        name: s.name().to_string(),
        version: s.version,
        max_batch_size: cfg.max_batch,
        max_queue_delay_us: cfg.max_delay.as_micros() as u64,
        input: meta.inputs.iter().map(tensor).collect(),
        output: meta.outputs.iter().map(tensor).collect(),
        parameters: s.spec.servable().parameters(),
    }
}

impl ModelConfig {
    /// As Triton's HTTP `GET /v2/models/{m}/config` answers it.
    pub(crate) fn to_json(&self) -> Value {
        let tensor = |t: &ConfigTensor| json!({ "name": t.name, "data_type": format!("TYPE_{}", t.datatype), "dims": t.dims });
        json!({
            "name": self.name,
            "platform": "ember",
            "backend": "ember",
            "max_batch_size": self.max_batch_size,
            "input": self.input.iter().map(tensor).collect::<Vec<_>>(),
            "output": self.output.iter().map(tensor).collect::<Vec<_>>(),
            "dynamic_batching": { "max_queue_delay_microseconds": self.max_queue_delay_us },
            "version_policy": { "specific": { "versions": [self.version] } },
            "parameters": self.parameters.iter()
                .map(|(k, v)| (k.to_string(), json!({ "string_value": v })))
                .collect::<serde_json::Map<_, _>>(),
        })
    }

    /// As gRPC's `ModelConfig` message (`proto/model_config.proto`).
    pub(crate) fn to_proto(&self) -> pb::ModelConfig {
        let dtype = |d: &str| {
            pb::DataType::from_str_name(&format!("TYPE_{d}")).unwrap_or(pb::DataType::TypeInvalid)
                as i32
        };
        pb::ModelConfig {
            name: self.name.clone(),
            platform: "ember".into(),
            backend: "ember".into(),
            version_policy: Some(pb::ModelVersionPolicy {
                policy_choice: Some(pb::model_version_policy::PolicyChoice::Specific(
                    pb::model_version_policy::Specific {
                        versions: vec![self.version as i64],
                    },
                )),
            }),
            max_batch_size: i32::try_from(self.max_batch_size).unwrap_or(i32::MAX),
            input: self
                .input
                .iter()
                .map(|t| pb::ModelInput {
                    name: t.name.clone(),
                    data_type: dtype(t.datatype),
                    dims: t.dims.clone(),
                })
                .collect(),
            output: self
                .output
                .iter()
                .map(|t| pb::ModelOutput {
                    name: t.name.clone(),
                    data_type: dtype(t.datatype),
                    dims: t.dims.clone(),
                })
                .collect(),
            dynamic_batching: Some(pb::ModelDynamicBatching {
                max_queue_delay_microseconds: self.max_queue_delay_us,
            }),
            parameters: self
                .parameters
                .iter()
                .map(|(k, v)| {
                    let p = pb::ModelParameter {
                        string_value: v.clone(),
                    };
                    (k.to_string(), p)
                })
                .collect(),
        }
    }
}

/// [`crate::batcher::ModelStats`] as the protocol's message.
pub(crate) fn stats_message(s: crate::batcher::ModelStats) -> pb::ModelStatistics {
    let d = |d: crate::batcher::DurationStat| {
        Some(pb::StatisticDuration {
            count: d.count,
            ns: d.ns,
        })
    };
    let i = s.inference_stats;
    pb::ModelStatistics {
        name: s.name,
        version: s.version,
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: d(i.success),
            fail: d(i.fail),
            queue: d(i.queue),
            compute_input: d(i.compute_input),
            compute_infer: d(i.compute_infer),
            compute_output: d(i.compute_output),
            cache_hit: d(i.cache_hit),
            cache_miss: d(Default::default()),
        }),
        batch_stats: s
            .batch_stats
            .into_iter()
            .map(|b| pb::InferBatchStatistics {
                batch_size: b.batch_size,
                compute_input: d(b.compute_input),
                compute_infer: d(b.compute_infer),
                compute_output: d(b.compute_output),
            })
            .collect(),
    }
}
