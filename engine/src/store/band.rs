//! The cleaning band: the disk use at which the log cleaner starts a
//! cleaning run (its top) and the one it cleans back down to (its bottom).

/// A cleaning run starts once the log holds more than the live data by
/// this fraction of it (plus a segment) ...
const DUE_OVER: (u64, u64) = (1, 3);
/// ... and goes on until it holds no more than this over it. The band sits
/// well below the foreground's wall at about twice the live data
/// ([`disk_budget`]): the cleaner, whose shares rise from the bottom of
/// the band to the wall (`Store::cleaner_shares`), gets ahead before
/// writes wait. A band nearer the wall copies less per segment freed but
/// has writes wait at it: `ferrite bench store --cleaner-only` (4 KiB
/// overwrites, 7 runs of each, alternating) with the band at a third to a
/// half over had writes wait at the wall 16-32 times a run, the log peak
/// at 1.76-1.94× the live data and busy p99 575-982 µs; at a quarter to a
/// third over, never, 1.63-1.74× and 573-733 µs, copying about a third more at
/// the same update rate. (At a sixth to a quarter over: no waits either,
/// and twice the copies.) Those runs' idle rounds rewrote every key, so
/// each busy pair started from a log of fresh segments. Under sustained
/// skew (the bench since 2026-12-06) the cold keys' segments lose about a
/// tenth of their records a round and, in this band, are cleaned at about
/// 85 % live. With 16 MiB live the cleaner copied about half as many
/// bytes as the foreground wrote and writes waited at the wall in most
/// runs; bands of half to two fifths and two thirds to a half over copied
/// a quarter and two fifths less, but had writes wait at the wall 140-700
/// times a run (2-3 runs each, with 64 and 128 KiB of copies per commit).
/// With 64 MiB live (the bench's default since), before [`WALL_ROOM`]
/// raised its band: 37 % and no waits; half to two fifths over copied 26 %
/// less, with the same busy/idle p99 (10 runs each, median block 1.79 and
/// 1.77).
const WANTED_OVER: (u64, u64) = (1, 4);
/// When the live data spans many segments, the band is raised towards the
/// wall: its top ([`DUE_OVER`]'s mark) to this share of the live data (or
/// [`WALL_ROOM_SEGMENTS`], if more) below [`disk_budget`], its bottom to
/// [`BAND_WIDTH`] of the live data below that. Cold records then lose
/// more of their segment before it is cleaned, so fewer are copied. With
/// 64 MiB of 4 KiB values (32 segments; `ferrite bench store
/// --cleaner-only` on a uring file, 16 runs of each alternating, on an
/// xstream) a band of two thirds to a half over the live data copied 39 %
/// fewer bytes than the quarter to a third, ran 8.6 % more updates/s with
/// the busy p50 at 253-280 µs against 307-336 µs, peaked at 1.76× the live
/// data and never had writes wait at the wall; the busy/idle p99 did not
/// change (median block 1.76 and 1.80: the foreground's tail is the
/// commits the copies ride in, however many there are). With 16 MiB live
/// (8 segments) such bands had writes wait at the wall: there the room
/// keeps the band where [`DUE_OVER`] and [`WANTED_OVER`] put it.
const WALL_ROOM: (u64, u64) = (1, 3);
/// See [`WALL_ROOM`].
const WALL_ROOM_SEGMENTS: u64 = 8;
/// See [`WALL_ROOM`].
const BAND_WIDTH: (u64, u64) = (1, 6);

/// Past the band's top by this share of a segment, the cleaner is behind
/// and picks its victims greedily ([`victim_score`]).
const BEHIND_TOP: (u64, u64) = (1, 2);

/// Is disk use `used` far enough over the band's `top` (segments of `seg`
/// bytes) that the cleaner should pick victims for the room they free now?
pub(super) fn behind(used: u64, top: u64, seg: u64) -> bool {
    used > top + seg * BEHIND_TOP.0 / BEHIND_TOP.1
}

/// How much a sealed segment whose live records fill `u` of it, written
/// `age` bytes of log ago, is worth cleaning. Normally the cost-benefit
/// of log-structured file systems, `(1 - u) * age / (1 + u)`: an old
/// segment of cold records is cleaned before a young one that still
/// loses records, so cold records are copied fewer times. But when the
/// cleaner is [`behind`], the emptiest first (`1 - u`): each pass then
/// frees the most room for the bytes it copies, so the foreground reaches
/// its wall less often. With 16 MiB live in 2 MiB segments (`ferrite bench
/// store --cleaner-only --cleaner-keys 4096`), cost-benefit alone picked
/// old segments 60-92 % live while the log climbed to the wall, and
/// writes waited there in every run (48-107 times, 10 runs); greedy past
/// half a segment over the top, 0-16 times (6 runs), copying as much, at
/// the same busy/idle p99. With 64 MiB live the log stays under that mark
/// and nothing changed.
pub(super) fn victim_score(u: f64, age: f64, behind: bool) -> f64 {
    if behind {
        1.0 - u
    } else {
        (1.0 - u) * age / (1.0 + u)
    }
}

/// Disk use foreground writes wait at while a cleaner runs, for `live`
/// bytes of live data in segments of `seg` bytes: twice the live data less
/// a segment (the room a cleaning pass's copies take before its victims
/// are freed), or the live data plus four segments if that is more (a hot
/// and a cold segment open, and room for the cleaner to work, when the
/// live data is a few segments).
pub(super) fn disk_budget(live: u64, seg: u64) -> u64 {
    (2 * live).saturating_sub(seg).max(live + 4 * seg)
}

/// Segments at the end of the log the band's marks stay below: the open
/// hot and cold segments, the cleaner's two slots and one more. Below
/// them the marks may rise to the rest of the log (or three quarters of
/// it, if that is more). They capped at three quarters once, and a store
/// with live data near that cleaned all the time, segments nearly full:
/// 70 % full of 4 KiB values under uniform overwrites
/// (`store_full.rs`), 1.4-2.3 bytes copied per byte written, and at 85 %
/// over 6.
const END_ROOM_SEGMENTS: u64 = 5;

/// The band's marks (bottom, top) for `live` bytes of live data in
/// segments of `seg` bytes and a device log of `log` bytes.
pub(super) fn band_marks(live: u64, seg: u64, log: u64) -> (u64, u64) {
    let over = |(num, den): (u64, u64)| live + live * num / den + seg;
    let room = (live * WALL_ROOM.0 / WALL_ROOM.1).max(WALL_ROOM_SEGMENTS * seg);
    let top = disk_budget(live, seg).saturating_sub(room);
    let bottom = top.saturating_sub(live * BAND_WIDTH.0 / BAND_WIDTH.1);
    let cap = (log / 4 * 3).max(log.saturating_sub(END_ROOM_SEGMENTS * seg));
    (
        over(WANTED_OVER).max(bottom).min(cap),
        over(DUE_OVER).max(top).min(cap),
    )
}

#[cfg(test)]
mod tests {
    use super::{band_marks, behind, disk_budget, victim_score};

    const MIB: u64 = 1 << 20;

    /// The budget for `live` in 2 MiB segments.
    fn budget(live: u64) -> u64 {
        disk_budget(live, 2 * MIB)
    }

    #[test]
    fn a_few_segments_of_live_data_keep_the_quarter_to_third_band() {
        let live = 16 * MIB;
        let (bottom, top) = band_marks(live, 2 * MIB, 1 << 40);
        assert_eq!(
            (bottom, top),
            (live + live / 4 + 2 * MIB, live + live / 3 + 2 * MIB)
        );
    }

    #[test]
    fn many_segments_of_live_data_raise_the_band_towards_the_wall() {
        let live = 64 * MIB;
        let (bottom, top) = band_marks(live, 2 * MIB, 1 << 40);
        // A third of the live data below the wall, a sixth of it wide.
        assert_eq!(top, budget(live) - live / 3);
        assert_eq!(bottom, top - live / 6);
        assert!(bottom > live + live / 3 + 2 * MIB, "{bottom}");
        assert!(top < 2 * live - 16 * MIB, "{top}");
    }

    #[test]
    fn the_band_stays_below_the_logs_last_segments() {
        let log = 128 * MIB;
        // Live data near the log's size: the top stays five segments
        // short of its end.
        let (bottom, top) = band_marks(100 * MIB, 2 * MIB, log);
        assert_eq!(top, 118 * MIB);
        assert!(bottom <= top, "{bottom}");
        // A log of few segments: three quarters of it.
        let (_, top) = band_marks(64 * MIB, 16 * MIB, log);
        assert_eq!(top, 96 * MIB);
    }

    #[test]
    fn a_cleaner_behind_picks_the_emptiest_segment_first() {
        // An old segment of cold records, 80 % live, 20 segments old,
        // against a young one, half live, 4 segments old.
        let (old, young) = ((0.8, 20.0), (0.5, 4.0));
        let score = |(u, age): (f64, f64), b| victim_score(u, age, b);
        assert!(score(old, false) > score(young, false));
        assert!(score(young, true) > score(old, true));
    }

    #[test]
    fn the_cleaner_is_behind_half_a_segment_over_the_top() {
        let (top, seg) = (40 * MIB, 2 * MIB);
        assert!(!behind(top, top, seg));
        assert!(!behind(top + MIB, top, seg));
        assert!(behind(top + MIB + 1, top, seg));
    }
}
