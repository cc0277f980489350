//! ember-tier's integration tests, in one binary: the tier against in-memory tables. The batch
//! generator is ember-embed's (its tests' `common` module, included from there).

#[path = "../../../ember-embed/tests/it/common/mod.rs"]
mod common;

mod tier_props;
