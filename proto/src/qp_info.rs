//! The verbs side channel's queue pair info: the 32-byte record each side of
//! an RC connection sends the other (engine `fabric/verbs`). Kept here, with
//! no verbs library behind it, so that the fuzz targets and any client can
//! decode it without linking libibverbs.
//!
//! Wire format (little-endian, 32 bytes; also in `FORMAT.md`):
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | magic `FVQP` |
//! | 4..8 | queue pair number (24 bits used) |
//! | 8..12 | first packet sequence number (24 bits used) |
//! | 12..28 | GID (RoCE v2: `::ffff:a.b.c.d`) |
//! | 28..30 | LID (0 on RoCE) |
//! | 30 | active MTU (`ibv_mtu`: 1 = 256 … 5 = 4096) |
//! | 31 | reserved, 0 |

use crate::FormatError;

pub const QP_INFO_BYTES: usize = 32;
const QP_INFO_MAGIC: [u8; 4] = *b"FVQP";
const _: () = assert!(4 + 4 + 4 + 16 + 2 + 1 + 1 == QP_INFO_BYTES);

/// What one side of an RC connection tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub lid: u16,
    pub mtu: u8,
}

impl QpInfo {
    pub fn encode(&self) -> [u8; QP_INFO_BYTES] {
        let mut b = [0u8; QP_INFO_BYTES];
        b[0..4].copy_from_slice(&QP_INFO_MAGIC);
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12..28].copy_from_slice(&self.gid);
        b[28..30].copy_from_slice(&self.lid.to_le_bytes());
        b[30] = self.mtu;
        b
    }

    pub fn decode(b: &[u8; QP_INFO_BYTES]) -> Result<Self, FormatError> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        if b[0..4] != QP_INFO_MAGIC {
            return Err(FormatError::BadMagic {
                what: "queue pair info",
                found: u32_at(0),
            });
        }
        let range = |field, value| FormatError::Range {
            what: "queue pair info",
            field,
            value,
        };
        if b[31] != 0 {
            return Err(range("reserved", u64::from(b[31])));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[12..28]);
        let info = Self {
            qpn: u32_at(4),
            psn: u32_at(8),
            gid,
            lid: u16::from_le_bytes([b[28], b[29]]),
            mtu: b[30],
        };
        if info.qpn > 0xff_ffff {
            return Err(range("qpn", u64::from(info.qpn)));
        }
        if info.psn > 0xff_ffff {
            return Err(range("psn", u64::from(info.psn)));
        }
        if !(1..=5).contains(&info.mtu) {
            return Err(range("mtu", u64::from(info.mtu)));
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_info_round_trips_and_rejects_garbage() {
        let i = QpInfo {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [7; 16],
            lid: 0,
            mtu: 3,
        };
        let b = i.encode();
        assert_eq!(&b[0..4], b"FVQP");
        assert_eq!(QpInfo::decode(&b).unwrap(), i);
        let mut bad = b;
        bad[0] = b'X';
        assert!(QpInfo::decode(&bad).is_err());
        let mut big_psn = b;
        big_psn[11] = 1;
        assert!(QpInfo::decode(&big_psn).is_err());
        let mut mtu = b;
        mtu[30] = 9;
        assert!(QpInfo::decode(&mtu).is_err());
        let mut reserved = b;
        reserved[31] = 1;
        assert!(QpInfo::decode(&reserved).is_err());
    }
}
