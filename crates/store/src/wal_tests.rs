//! The write-ahead log's tests: the record format, replay (a torn tail,
//! damage resynchronised past), and the writer.

use super::*;

fn ops(n: u8) -> Vec<Op> {
    vec![
        Op::Insert(vec![b'e', n], vec![n; usize::from(n) * 3]),
        Op::Remove(vec![b'x', n]),
    ]
}

#[test]
fn records_round_trip_and_a_torn_or_damaged_tail_is_dropped() {
    let mut buf = Vec::new();
    for n in 1..=3 {
        encode(&mut buf, &ops(n));
    }
    let whole = buf.len();
    assert_eq!(decode_all(&buf), (vec![ops(1), ops(2), ops(3)], 0));
    // Cut anywhere inside the last record: the first two survive.
    let mut two = Vec::new();
    encode(&mut two, &ops(1));
    let two_len = encode(&mut two, &ops(2));
    for cut in two_len..whole {
        assert_eq!(
            decode_all(&buf[..cut]),
            (vec![ops(1), ops(2)], cut - two_len),
            "cut at {cut}"
        );
    }
    // A flipped byte in the second record's payload: only the first.
    let mut damaged = buf.clone();
    damaged[two_len - 1] ^= 0x40;
    let one_len = encode(&mut Vec::new(), &ops(1));
    assert_eq!(decode_all(&damaged), (vec![ops(1)], whole - one_len));
}

#[test]
fn replay_resynchronises_past_damage_and_keeps_every_intact_record() {
    let mut buf = Vec::new();
    let ends: Vec<usize> = (1..=20).map(|n| encode(&mut buf, &ops(n))).collect();
    let all: Vec<_> = (1..=20).map(ops).collect();
    // One flipped byte in the first record's payload: the other 19.
    let mut flipped = buf.clone();
    flipped[9] ^= 0x01;
    let scan1 = scan(&flipped);
    assert_eq!(scan1.records, all[1..].to_vec());
    assert_eq!((scan1.skipped, scan1.torn_tail), (vec![(0, ends[0])], 0));
    // A stretch overwritten in the middle (records 5 to 7 in part).
    let mut hole = buf.clone();
    for b in &mut hole[ends[4] + 3..ends[6] - 2] {
        *b = 0xA5;
    }
    let scan2 = scan(&hole);
    let mut kept = all[..5].to_vec();
    kept.extend_from_slice(&all[7..]);
    assert_eq!(scan2.records, kept);
    assert_eq!(scan2.skipped, vec![(ends[4], ends[6] - ends[4])]);
    // A torn tail (cut short, or zeros where the record was to be) is
    // what a crash leaves: dropped, not damage.
    let cut = scan(&buf[..ends[19] - 5]);
    assert_eq!(cut.records, all[..19].to_vec());
    assert_eq!(
        (cut.skipped.len(), cut.torn_tail),
        (0, ends[19] - 5 - ends[18])
    );
    let mut zeros = buf.clone();
    zeros.extend_from_slice(&[0; 4096]);
    assert_eq!(scan(&zeros).torn_tail, 4096);
    assert!(scan(&zeros).skipped.is_empty());
    // An emptied file holds nothing; a file of noise is all damage.
    assert_eq!(
        scan(&[]),
        Scan {
            records: vec![],
            skipped: vec![],
            torn_tail: 0
        }
    );
    let noise: Vec<u8> = (0u32..10_000)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let scan3 = scan(&noise);
    assert!(scan3.records.is_empty());
    assert_eq!(scan3.skipped, vec![(0, noise.len())]);
}

#[tokio::test]
async fn a_damaged_file_is_kept_aside_and_its_intact_records_replayed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, tree) = a_tree(dir.path());
    let wal_dir = dir.path().join(DIR);
    create_private_dir(&wal_dir).expect("dir");
    let mut buf = Vec::new();
    for n in 1..=5 {
        encode(&mut buf, &ops(n));
    }
    buf[9] ^= 0x01;
    let path = file_path(&wal_dir, 3);
    std::fs::write(&path, &buf).expect("write");
    let (_wal, replay) = Wal::open(&wal_dir, tree.clone()).expect("open");
    assert_eq!(replay.records, 4);
    assert_eq!(replay.damaged.len(), 1);
    let damage = &replay.damaged[0];
    assert_eq!(
        damage.kept_as,
        wal_dir.join(format!("{:020}.log.damaged", 3))
    );
    assert_eq!(damage.intact_records, 4);
    assert_eq!(damage.skipped_bytes, encode(&mut Vec::new(), &ops(1)));
    assert_eq!(
        tree.get([b'e', 1]).expect("get"),
        None,
        "the damaged record"
    );
    for n in 2..=5u8 {
        assert!(
            tree.get([b'e', n]).expect("get").is_some(),
            "record {n} kept"
        );
    }
    // Kept aside whole, never deleted, and not replayed again.
    assert!(!path.exists());
    assert_eq!(std::fs::read(&damage.kept_as).expect("kept"), buf);
    assert!(log_files(&wal_dir).expect("list").is_empty());
}

/// A sled database in `dir` and a tree of it.
fn a_tree(dir: &Path) -> (sled::Db, sled::Tree) {
    let db = sled::Config::new()
        .path(dir.join("db"))
        .open()
        .expect("sled");
    let tree = db.open_tree("t").expect("tree");
    (db, tree)
}

#[tokio::test]
async fn what_a_crash_left_in_the_log_is_replayed_into_the_tree_and_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, tree) = a_tree(dir.path());
    tree.insert(b"x\x02", b"stale".to_vec()).expect("insert");
    let wal_dir = dir.path().join(DIR);
    create_private_dir(&wal_dir).expect("dir");
    // Two files, as a crash between a rotation and its checkpoint
    // leaves them; the second ends in a torn record.
    let mut first = Vec::new();
    encode(&mut first, &ops(1));
    std::fs::write(file_path(&wal_dir, 4), &first).expect("write");
    let mut second = Vec::new();
    encode(&mut second, &ops(2));
    let torn = encode(&mut second, &ops(3)) - 2;
    std::fs::write(file_path(&wal_dir, 5), &second[..torn]).expect("write");

    let (wal, replay) = Wal::open(&wal_dir, tree.clone()).expect("open");
    assert_eq!(replay.records, 2);
    assert!(replay.damaged.is_empty(), "a torn tail is no damage");
    assert_eq!(
        tree.get([b'e', 1]).expect("get").as_deref(),
        Some(&[1u8; 3][..])
    );
    assert_eq!(
        tree.get([b'e', 2]).expect("get").as_deref(),
        Some(&[2u8; 6][..])
    );
    assert_eq!(
        tree.get(b"x\x02").expect("get"),
        None,
        "the remove replayed"
    );
    assert_eq!(
        tree.get([b'e', 3]).expect("get"),
        None,
        "the torn record dropped"
    );
    // The replayed files are gone; the writer numbers on from them.
    assert_eq!(log_files(&wal_dir).expect("list").len(), 0);
    wal.commit(ops(7)).await.expect("commit");
    let numbers: Vec<_> = log_files(&wal_dir)
        .expect("list")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(numbers, [6]);
}

#[tokio::test]
async fn committed_batches_are_in_the_log_whole_in_order_and_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, tree) = a_tree(dir.path());
    let wal_dir = dir.path().join(DIR);
    let (wal, _) = Wal::open(&wal_dir, tree.clone()).expect("open");
    let writes: Vec<_> = (1..=20u8).map(|n| wal.commit(ops(n))).collect();
    for result in futures_util::future::join_all(writes).await {
        result.expect("commit");
    }
    // What the log file holds now is what a crash would replay: every
    // batch, whole, in order.
    let files = log_files(&wal_dir).expect("list");
    assert_eq!(files.len(), 1);
    let (records, rest) = decode_all(&std::fs::read(&files[0].1).expect("read"));
    assert_eq!(rest, 0);
    assert_eq!(records, (1..=20u8).map(ops).collect::<Vec<_>>());
    assert_eq!(
        tree.get([b'e', 20]).expect("get").as_deref(),
        Some(&[20u8; 60][..])
    );
    assert_eq!(wal.counters.batches.load(Ordering::Relaxed), 20);
    assert!(wal.counters.syncs.load(Ordering::Relaxed) <= 20);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&files[0].1).expect("meta").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the log is private to the user");
}

#[tokio::test]
async fn the_writer_marks_each_synced_length_beside_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, tree) = a_tree(dir.path());
    let wal_dir = dir.path().join(DIR);
    let (wal, _) = Wal::open(&wal_dir, tree).expect("open");
    for n in 1..=3u8 {
        wal.commit(ops(n)).await.expect("commit");
        let files = log_files(&wal_dir).expect("list");
        let len = std::fs::metadata(&files[0].1).expect("meta").len();
        assert_eq!(ack::read(&files[0].1), Some(len as usize), "after {n}");
    }
}

/// `wal_dir` holding log 7 of records 1..=`n`, and its marker saying
/// `acked` bytes were synced; returns the log's path and bytes.
fn a_log_marked(wal_dir: &Path, n: u8, acked: Option<usize>) -> (PathBuf, Vec<u8>) {
    create_private_dir(wal_dir).expect("dir");
    let mut buf = Vec::new();
    for i in 1..=n {
        encode(&mut buf, &ops(i));
    }
    let path = file_path(wal_dir, 7);
    std::fs::write(&path, &buf).expect("write");
    if let Some(acked) = acked {
        std::fs::write(ack::path_of(&path), (acked as u64).to_le_bytes()).expect("marker");
    }
    (path, buf)
}

#[tokio::test]
async fn a_log_cut_short_of_what_was_acknowledged_is_damage_not_a_torn_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, tree) = a_tree(dir.path());
    let wal_dir = dir.path().join(DIR);
    let (path, buf) = a_log_marked(&wal_dir, 10, None);
    let acked = buf.len();
    std::fs::write(ack::path_of(&path), (acked as u64).to_le_bytes()).expect("marker");
    // Cut in half: what remains ends like a torn record.
    let half = acked / 2;
    std::fs::write(&path, &buf[..half]).expect("cut");
    assert!(scan(&buf[..half]).torn_tail > 0, "shaped like a torn tail");
    let (_wal, replay) = Wal::open(&wal_dir, tree).expect("open");
    assert_eq!(replay.damaged.len(), 1, "{replay:?}");
    let d = &replay.damaged[0];
    let (intact, torn) = decode_all(&buf[..half]);
    assert_eq!(d.intact_records, intact.len());
    let readable = half - torn;
    assert_eq!(d.stretches, vec![(readable, acked - readable)]);
    assert!(d.kept_as.exists(), "kept aside");
    assert!(!ack::path_of(&path).exists(), "the marker goes with it");
}

#[tokio::test]
async fn a_torn_tail_past_what_was_acknowledged_is_no_damage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, tree) = a_tree(dir.path());
    let wal_dir = dir.path().join(DIR);
    let mut two = Vec::new();
    encode(&mut two, &ops(1));
    let acked = encode(&mut two, &ops(2));
    let (path, buf) = a_log_marked(&wal_dir, 3, Some(acked));
    std::fs::write(&path, &buf[..buf.len() - 2]).expect("torn");
    let (_wal, replay) = Wal::open(&wal_dir, tree).expect("open");
    assert!(replay.damaged.is_empty(), "{replay:?}");
    assert_eq!(replay.records, 2);
    assert!(!path.exists() && !ack::path_of(&path).exists());
}

#[tokio::test]
async fn a_log_replaced_by_a_directory_or_deleted_is_damage() {
    for deleted in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_db, tree) = a_tree(dir.path());
        let wal_dir = dir.path().join(DIR);
        let (path, buf) = a_log_marked(&wal_dir, 4, None);
        std::fs::write(ack::path_of(&path), (buf.len() as u64).to_le_bytes()).expect("marker");
        std::fs::remove_file(&path).expect("rm");
        if !deleted {
            std::fs::create_dir(&path).expect("a directory in its place");
        }
        let (_wal, replay) = Wal::open(&wal_dir, tree).expect("open");
        assert_eq!(replay.damaged.len(), 1, "deleted: {deleted}: {replay:?}");
        let d = &replay.damaged[0];
        assert_eq!(d.skipped_bytes, buf.len());
        assert!(d.unreadable.is_some());
        assert_eq!(d.kept_as.is_dir(), !deleted, "the directory is kept aside");
        assert!(!path.exists() && !ack::path_of(&path).exists());
    }
}
