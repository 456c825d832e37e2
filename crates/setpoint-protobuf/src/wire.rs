//! Protobuf wire format: keys, varints, fixed-width and length-delimited values.

/// Protobuf wire types.
pub(crate) const VARINT: u8 = 0;
pub(crate) const FIXED64: u8 = 1;
pub(crate) const LEN: u8 = 2;
pub(crate) const START_GROUP: u8 = 3;
pub(crate) const END_GROUP: u8 = 4;
pub(crate) const FIXED32: u8 = 5;

/// A low-level decoding failure, before the decoder adds the message and field it happened in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The input ended inside a key or value.
    Truncated,
    /// Anything else, described for humans.
    Invalid(String),
}

/// One decoded value, borrowed from the input.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Raw<'a> {
    Varint(u64),
    Fixed64(u64),
    /// No Kubernetes field is 32-bit fixed-width; such values are only skipped.
    Fixed32,
    Len(&'a [u8]),
}

impl Raw<'_> {
    pub(crate) fn wire_type(&self) -> u8 {
        match self {
            Raw::Varint(_) => VARINT,
            Raw::Fixed64(_) => FIXED64,
            Raw::Fixed32 => FIXED32,
            Raw::Len(_) => LEN,
        }
    }
}

pub(crate) fn wire_type_name(wt: u8) -> &'static str {
    match wt {
        VARINT => "varint",
        FIXED64 => "64-bit",
        LEN => "length-delimited",
        START_GROUP => "start-group",
        END_GROUP => "end-group",
        FIXED32 => "32-bit",
        _ => "invalid",
    }
}

/// Cursor over a protobuf-encoded message.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(crate) fn varint(&mut self) -> Result<u64, WireError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(WireError::Truncated);
            };
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(WireError::Invalid("varint longer than 64 bits".into()));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::Invalid("varint longer than 10 bytes".into()))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let out = self.buf.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    /// Reads a field key: (field number, wire type).
    pub(crate) fn key(&mut self) -> Result<(u32, u8), WireError> {
        let key = self.varint()?;
        let field = key >> 3;
        let wt = (key & 7) as u8;
        if field == 0 || field > (1 << 29) - 1 {
            return Err(WireError::Invalid(format!("invalid field number {field}")));
        }
        Ok((field as u32, wt))
    }

    /// Reads the value that follows a key of wire type `wt`. Groups are not supported (no
    /// Kubernetes message uses them).
    pub(crate) fn value(&mut self, wt: u8) -> Result<Raw<'a>, WireError> {
        match wt {
            VARINT => Ok(Raw::Varint(self.varint()?)),
            FIXED64 => {
                let b = self.take(8)?;
                Ok(Raw::Fixed64(u64::from_le_bytes(
                    b.try_into().expect("8 bytes"),
                )))
            }
            FIXED32 => {
                self.take(4)?;
                Ok(Raw::Fixed32)
            }
            LEN => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| WireError::Truncated)?;
                Ok(Raw::Len(self.take(len)?))
            }
            START_GROUP | END_GROUP => Err(WireError::Invalid(format!(
                "unsupported {} wire type",
                wire_type_name(wt)
            ))),
            _ => Err(WireError::Invalid(format!("invalid wire type {wt}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        assert_eq!(Reader::new(&[0x00]).varint(), Ok(0));
        assert_eq!(Reader::new(&[0x96, 0x01]).varint(), Ok(150));
        // -1 as int64: ten bytes.
        let minus_one = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(Reader::new(&minus_one).varint(), Ok(u64::MAX));
        assert_eq!(Reader::new(&[0x80]).varint(), Err(WireError::Truncated));
        let too_long = [0xff; 11];
        assert!(matches!(
            Reader::new(&too_long).varint(),
            Err(WireError::Invalid(_))
        ));
    }

    #[test]
    fn keys_and_values() {
        let mut r = Reader::new(&[0x0a, 0x02, b'h', b'i', 0x10, 0x05]);
        assert_eq!(r.key(), Ok((1, LEN)));
        assert!(matches!(r.value(LEN), Ok(Raw::Len(b"hi"))));
        assert_eq!(r.key(), Ok((2, VARINT)));
        assert!(matches!(r.value(VARINT), Ok(Raw::Varint(5))));
        assert!(r.is_empty());
        assert!(matches!(
            Reader::new(&[0x00]).key(),
            Err(WireError::Invalid(_))
        ));
        assert!(matches!(
            Reader::new(&[0x0a, 0x05, 1]).value(LEN),
            Err(WireError::Truncated)
        ));
        assert!(matches!(
            Reader::new(&[]).value(START_GROUP),
            Err(WireError::Invalid(_))
        ));
    }
}
