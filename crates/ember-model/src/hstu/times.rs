//! Where an HSTU forward pass spent its time, by stage.

use std::time::Duration;

/// Where a forward pass spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HstuTimes {
    /// The embedding lookups (staging from a tier included when it ran inline).
    pub lookups: Duration,
    /// The input MLPs, the contextual slots and the encodings.
    pub preprocess: Duration,
    /// The STU layers' two projections.
    pub projections: Duration,
    pub attention: Duration,
    /// The STU layers' norms and elementwise work.
    pub pointwise: Duration,
    /// Postprocessor, item MLP and head.
    pub head: Duration,
    pub wall: Duration,
}

impl HstuTimes {
    pub fn plus(self, o: HstuTimes) -> HstuTimes {
        HstuTimes {
            lookups: self.lookups + o.lookups,
            preprocess: self.preprocess + o.preprocess,
            projections: self.projections + o.projections,
            attention: self.attention + o.attention,
            pointwise: self.pointwise + o.pointwise,
            head: self.head + o.head,
            wall: self.wall + o.wall,
        }
    }
}
