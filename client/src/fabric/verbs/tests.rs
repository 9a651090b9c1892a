use super::*;
use ferrite_proto::region::Provider;

fn d(target: u16, kind: RegionKind, id: u32) -> RegionDescriptor {
    RegionDescriptor {
        provider: Provider::Verbs,
        kind,
        target,
        region_id: id,
        length: 4096,
        param: match kind {
            RegionKind::Buckets => 4,
            RegionKind::Log | RegionKind::DeviceLog => 4096,
        },
        access_key: 0x1234,
        remote_addr: 0x7f00_0000_0000 + u64::from(id) * 4096,
    }
}

#[test]
fn descriptors_pair_up_by_target() {
    let regs = [
        d(1, RegionKind::Log, 3),
        d(0, RegionKind::Buckets, 0),
        d(1, RegionKind::Buckets, 2),
        d(0, RegionKind::Log, 1),
    ];
    let t = pair_targets(&regs).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!((t[0].buckets.region_id, t[0].log.region_id), (0, 1));
    assert_eq!((t[1].buckets.region_id, t[1].log.region_id), (2, 3));
    assert!(pair_targets(&regs[..3]).is_err(), "target 0 has no log");
    let dup = [regs[1], regs[1], regs[3]];
    assert!(pair_targets(&dup).is_err(), "two bucket regions");
}

#[test]
fn verbs_descriptors_survive_encoding() {
    let x = d(7, RegionKind::Buckets, 14);
    let back = RegionDescriptor::decode(&x.encode()).unwrap();
    assert_eq!(back, x);
    assert_eq!(back.provider, Provider::Verbs);
    assert_eq!(back.access_key as u32, 0x1234, "rkey");
}

#[test]
fn connect_without_a_device_names_what_was_found() {
    let kernel_has_none = !std::path::Path::new("/sys/class/infiniband").exists();
    match VerbsEndpoint::connect("127.0.0.1:9", &DeviceSelector::Any) {
        Err(e) if kernel_has_none => {
            let m = e.to_string();
            assert!(m.contains(ferrite_engine::fabric::verbs::NO_DEVICE), "{m}");
        }
        Err(e) => assert!(e.to_string().contains("verbs"), "{e}"),
        Ok(_) => panic!("nothing listens on port 9"),
    }
}
