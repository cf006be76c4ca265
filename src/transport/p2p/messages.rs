//! What the P2P transport tells a peer: at set-up, how to map our buffer, epoch block and fast flag; at
//! `mscclppRegisterBuffer`, how to map a registered buffer. Both name our process, so that a peer in the
//! same process uses our addresses directly (CUDA IPC cannot open a process's own allocations).

use crate::codec::{Reader, Writer};
use crate::error::Result;
use crate::gpu::IpcExport;
use crate::gpu::ProcessId;

/// What one side of a P2P connection sends its peer during set-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pSetupInfo {
    pub process: ProcessId,
    /// The sender's GPU (for logs).
    pub device: i32,
    pub buffer: IpcExport,
    /// The sender's epoch block.
    pub epochs: IpcExport,
    /// The sender's fast flag, if it has one: the shared host object's name and the word's offset.
    pub fast_flag: Option<(String, u32)>,
}

const SETUP_MAGIC: u32 = 0x4d53_5032; // "MSP2"

/// The longest shared-memory name a set-up message may carry (POSIX names are at most `NAME_MAX`).
const MAX_SHM_NAME: usize = 255;

impl P2pSetupInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(256);
        w.u32(SETUP_MAGIC);
        self.process.write(&mut w);
        w.i32(self.device);
        self.buffer.write(&mut w);
        self.epochs.write(&mut w);
        let (name, offset) = self.fast_flag.as_ref().map_or(("", 0), |(n, o)| (n.as_str(), *o));
        w.string(name.as_bytes()).u32(offset);
        w.into_bytes()
    }

    pub fn from_bytes(b: &[u8]) -> Result<P2pSetupInfo> {
        let mut r = Reader::new(b, "P2P set-up message");
        r.magic(SETUP_MAGIC)?;
        let process = ProcessId::read(&mut r)?;
        let device = r.i32()?;
        let buffer = IpcExport::read(&mut r)?;
        let epochs = IpcExport::read(&mut r)?;
        let name = r.string(MAX_SHM_NAME)?;
        let offset = r.u32()?;
        let fast_flag = if name.is_empty() {
            None
        } else {
            let name = std::str::from_utf8(name).map_err(|_| r.malformed("names shared memory in non-UTF-8"))?;
            Some((name.to_string(), offset))
        };
        r.finish()?;
        Ok(P2pSetupInfo {
            process,
            device,
            buffer,
            epochs,
            fast_flag,
        })
    }
}

/// One registered buffer, as sent to a P2P peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterInfo {
    pub process: ProcessId,
    pub buffer: IpcExport,
}

const REGISTER_MAGIC: u32 = 0x4d53_5052; // "MSPR"

impl RegisterInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(128);
        w.u32(REGISTER_MAGIC);
        self.process.write(&mut w);
        self.buffer.write(&mut w);
        w.into_bytes()
    }

    pub fn from_bytes(b: &[u8]) -> Result<RegisterInfo> {
        let mut r = Reader::new(b, "registered-buffer message");
        r.magic(REGISTER_MAGIC)?;
        let info = RegisterInfo {
            process: ProcessId::read(&mut r)?,
            buffer: IpcExport::read(&mut r)?,
        };
        r.finish()?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(x: u8) -> IpcExport {
        IpcExport {
            handle: [x; 64],
            offset: x as u64,
            size: 1000 + x as u64,
            address: 0x1000 * x as u64,
        }
    }

    #[test]
    fn setup_info_round_trips() {
        let s = P2pSetupInfo {
            process: ProcessId::this(),
            device: 1,
            buffer: export(1),
            epochs: export(2),
            fast_flag: None,
        };
        assert_eq!(P2pSetupInfo::from_bytes(&s.to_bytes()).unwrap(), s);
        let with_flag = P2pSetupInfo {
            fast_flag: Some(("/mscclpp-1-2-3".into(), 128)),
            ..s.clone()
        };
        assert_eq!(P2pSetupInfo::from_bytes(&with_flag.to_bytes()).unwrap(), with_flag);
        let mut cut = with_flag.to_bytes();
        cut.pop();
        assert!(P2pSetupInfo::from_bytes(&cut).is_err());
        let mut bad = s.to_bytes();
        bad[0] ^= 1;
        assert!(P2pSetupInfo::from_bytes(&bad).is_err());
        assert!(P2pSetupInfo::from_bytes(&bad[..20]).is_err());
    }

    #[test]
    fn register_info_round_trips_and_rejects_garbage() {
        let r = RegisterInfo {
            process: ProcessId { host: 9, pid: 7 },
            buffer: IpcExport {
                handle: [4; 64],
                offset: 1,
                size: 2,
                address: 3,
            },
        };
        assert_eq!(RegisterInfo::from_bytes(&r.to_bytes()).unwrap(), r);
        assert!(RegisterInfo::from_bytes(&[1, 2, 3]).is_err());
        let mut long = r.to_bytes();
        long.push(0);
        assert!(RegisterInfo::from_bytes(&long).is_err());
    }

    #[test]
    fn process_id_is_stable_within_a_process() {
        assert_eq!(ProcessId::this(), ProcessId::this());
    }
}
