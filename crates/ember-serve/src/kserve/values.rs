//! The values of a KServe JSON request's tensors (`data`), as parsing leaves them: every
//! input's leaves in one compact list ([`Values`]), each input holding its range there.

/// A leaf of a tensor's `data`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    I(i64),
    U(u64),
    F(f64),
    /// Not a number (a string, bool or null): kept so that the error can name the input.
    Other,
}

/// The `data` leaves of a request, compact: 4 bytes and 2 bits each, so that a request's values
/// cost about twice their JSON at most (every value takes 2 bytes or more there). Integers that
/// fit in 32 bits are kept as they are, and wider ones beside; fractions as the f32 every
/// fractional value becomes (an FP32 tensor's; any other refuses them).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Values {
    words: Vec<u32>,
    /// 2 bits per value, 4 values a byte: [`Values::INT`], [`Values::F32`], ...
    kinds: Vec<u8>,
    wide: Vec<Num>,
}

impl Values {
    const INT: u8 = 0;
    const F32: u8 = 1;
    const WIDE: u8 = 2;
    const OTHER: u8 = 3;

    pub fn with_capacity(n: usize) -> Self {
        Values {
            words: Vec::with_capacity(n),
            kinds: Vec::with_capacity(n.div_ceil(4)),
            wide: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn push(&mut self, v: Num) {
        let (word, kind) = match v {
            Num::I(x) if i32::try_from(x).is_ok() => (x as i32 as u32, Self::INT),
            Num::U(x) if x <= i32::MAX as u64 => (x as u32, Self::INT),
            Num::F(x) => ((x as f32).to_bits(), Self::F32),
            Num::Other => (0, Self::OTHER),
            wide => {
                self.wide.push(wide);
                ((self.wide.len() - 1) as u32, Self::WIDE)
            }
        };
        let i = self.words.len();
        if i.is_multiple_of(4) {
            self.kinds.push(0);
        }
        self.kinds[i / 4] |= kind << (2 * (i % 4));
        self.words.push(word);
    }

    /// The value at `i` (a fraction as the f32 it was kept as).
    pub fn get(&self, i: usize) -> Num {
        let w = self.words[i];
        match (self.kinds[i / 4] >> (2 * (i % 4))) & 3 {
            Self::INT => Num::I(i64::from(w as i32)),
            Self::F32 => Num::F(f64::from(f32::from_bits(w))),
            Self::WIDE => self.wide[w as usize],
            _ => Num::Other,
        }
    }

    /// The values at `range`.
    pub fn iter(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = Num> + '_ {
        range.map(|i| self.get(i))
    }
}

/// Appends the leaves of one JSON value to the list.
/// (A tensor's `data` may be flat or nested arrays; it is read row-major into one list while
/// parsing, with no intermediate JSON tree: 2x faster than `serde_json::Value`.)
pub(super) struct Flatten<'a>(pub(super) &'a mut Values);

impl<'de> serde::de::DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Flatten<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a number or an array")
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<(), E> {
        self.0.push(Num::I(v));
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<(), E> {
        self.0.push(Num::U(v));
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<(), E> {
        self.0.push(Num::F(v));
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        self.0.push(Num::Other);
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        self.0.push(Num::Other);
        Ok(())
    }
    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        self.0.push(Num::Other);
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        while seq.next_element_seed(Flatten(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        // An object is not a tensor value; record it as one bad leaf and skip its contents.
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        self.0.push(Num::Other);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_what_each_reader_needs_in_a_quarter_of_the_space() {
        let all = [
            Num::I(-5),
            Num::U(7),
            Num::I(i64::MIN),
            Num::U(u64::MAX),
            Num::U(i32::MAX as u64 + 1),
            Num::F(2.5),
            Num::F(0.1),
            Num::Other,
            Num::I(i32::MIN as i64),
        ];
        let mut v = Values::with_capacity(0);
        for &x in &all {
            v.push(x);
        }
        assert_eq!(v.len(), all.len());
        let got: Vec<Num> = v.iter(0..v.len()).collect();
        assert_eq!(
            got,
            [
                Num::I(-5),
                Num::I(7),
                Num::I(i64::MIN),
                Num::U(u64::MAX),
                Num::U(i32::MAX as u64 + 1),
                Num::F(2.5),
                // Kept as the f32 an FP32 tensor reads.
                Num::F(f64::from(0.1f32)),
                Num::Other,
                Num::I(i32::MIN as i64),
            ]
        );
        // 4 bytes and 2 bits a value (wide integers aside).
        assert_eq!(v.words.len() * 4 + v.kinds.len(), 9 * 4 + 3);
        assert_eq!(v.wide.len(), 3);
    }
}
