//! Times as the engine and sandbox-init write them (RFC 3339, UTC): seconds since the epoch,
//! for an uptime and for how long ago a budget was spent.

/// Seconds since the epoch of `2026-12-06T10:00:00.000Z` (UTC, the fraction optional); None if
/// it is not such a time.
pub fn epoch_of(time: &str) -> Option<i64> {
    let (date, clock) = time.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let clock = clock.split_once('.').map_or(clock, |(whole, _)| whole);
    let mut c = clock.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, min, sec) = (c.next()??, c.next()??, c.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || sec > 60 {
        return None;
    }
    // Days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + sec)
}

/// Seconds since the epoch, now.
pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_seconds_since_the_epoch() {
        assert_eq!(epoch_of("2026-12-06T10:00:00.000Z"), Some(1_796_551_200));
        assert_eq!(epoch_of("2026-12-06T10:00:00.123456789Z"), Some(1_796_551_200));
        assert_eq!(epoch_of("2000-02-29T23:59:59Z"), Some(951_868_799));
        for bad in ["", "2026-12-06", "2026-13-06T10:00:00Z", "2026-12-06T10:00:00", "x-y-zT1:2:3Z"] {
            assert_eq!(epoch_of(bad), None, "{bad}");
        }
    }
}
