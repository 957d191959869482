//! The inbox's admin contract on SQL: find, list and re-queue read by key with the filter in
//! the statement; pausing is a row of `<table>_paused`.

use super::*;

/// Listing and re-queueing read by key, with the filter's conditions in the statement (an
/// entry's error is checked again on what was read: a page may hold fewer than asked). The
/// bulk re-queue is one statement. Pausing is a row of `<table>_paused`, which every take
/// reads in its statement; the resume is told like an enqueue.
impl<DB: Dialect> InboxAdmin for SqlInbox<DB> {
    async fn find(&self, key: &StoreKey) -> Result<Option<EntryInfo>, StoreError> {
        let mut conn = acquire(&self.pool).await?;
        let rows = fetch::<DB>(
            &mut conn,
            &self.sql.find,
            &[Param::Text(key.as_str())],
            None,
        )
        .await?;
        let now = epoch_ms(SystemTime::now());
        rows.first().map_or(Ok(None), |row| info::<DB>(row, now))
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let after = after(cursor)?;
        let state = filter.state.map(state_name);
        let filtered = filter_params(filter, after, epoch_ms(SystemTime::now()), limit, state);
        let mut params = Vec::from(filtered);
        params.push(Param::Int(i64::from(filter.with_bodies)));
        let mut conn = acquire(&self.pool).await?;
        let rows = fetch::<DB>(&mut conn, &self.sql.list, &params, None).await?;
        let now = epoch_ms(SystemTime::now());
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            if let Some(info) = info::<DB>(row, now)?.filter(|info| filter.matches(info)) {
                entries.push(info);
            }
        }
        // A full page read: the next one starts after its last row, whatever matched of it.
        let next = match (rows.len() == limit, rows.last()) {
            (true, Some(last)) => Some(row_key::<DB>(last)?),
            _ => None,
        };
        Ok(Page::new(entries, next))
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let limit = Param::Int(i64::try_from(limit).unwrap_or(i64::MAX));
        let mut conn = acquire(&self.pool).await?;
        let rows = fetch::<DB>(&mut conn, &self.sql.dead_letters, &[limit], None).await?;
        rows.iter()
            .map(|row| {
                let last_error = DB::text(row, 12).map_err(error::<DB>)?;
                Ok(DeadLetter {
                    entry: entry::<DB>(row)?,
                    last_error: last_error.unwrap_or_default().to_owned(),
                })
            })
            .collect()
    }

    async fn requeue(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let params = [
            Param::Text(key.as_str()),
            Param::Int(epoch_ms(SystemTime::now())),
        ];
        let mut conn = acquire(&self.pool).await?;
        let requeued = !fetch::<DB>(&mut conn, &self.sql.requeue, &params, None)
            .await?
            .is_empty();
        if requeued {
            self.tell(SystemTime::now());
        }
        Ok(requeued)
    }

    async fn requeue_matching(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Requeued, StoreError> {
        let after = after(cursor)?;
        let now = SystemTime::now();
        let dead = Some(state_name(KeyState::Dead));
        let params = filter_params(filter, after, epoch_ms(now), limit, dead);
        let mut conn = acquire(&self.pool).await?;
        let rows = fetch::<DB>(&mut conn, &self.sql.requeue_matching, &params, None).await?;
        drop(conn);
        let keys = rows
            .iter()
            .map(|row| row_key::<DB>(row))
            .collect::<Result<Vec<_>, _>>()?;
        if !keys.is_empty() {
            self.tell(now);
        }
        // Fewer than the limit: no matching dead letter is left after this page (but those
        // another re-queue held, locked, which it re-queues).
        let next = match keys.len() == limit {
            true => keys.into_iter().max(),
            false => None,
        };
        Ok(Requeued {
            requeued: u64::try_from(rows.len()).unwrap_or(u64::MAX),
            next,
        })
    }

    async fn discard(&self, key: &StoreKey, retention: Duration) -> Result<bool, StoreError> {
        let until = epoch_ms(SystemTime::now()).saturating_add(millis(retention));
        let params = [Param::Text(key.as_str()), Param::Int(until)];
        let mut conn = acquire(&self.pool).await?;
        Ok(!fetch::<DB>(&mut conn, &self.sql.discard, &params, None)
            .await?
            .is_empty())
    }

    async fn pause(&self) -> Result<(), StoreError> {
        let now = Param::Int(epoch_ms(SystemTime::now()));
        let mut conn = acquire(&self.pool).await?;
        execute::<DB>(&mut conn, &self.sql.pause, &[now], None).await?;
        Ok(())
    }

    async fn resume(&self) -> Result<(), StoreError> {
        let now = SystemTime::now();
        let mut conn = acquire(&self.pool).await?;
        let resumed = !fetch::<DB>(
            &mut conn,
            &self.sql.resume,
            &[Param::Int(epoch_ms(now))],
            None,
        )
        .await?
        .is_empty();
        if resumed {
            self.tell(now);
        }
        Ok(())
    }

    async fn is_paused(&self) -> Result<bool, StoreError> {
        let mut conn = acquire(&self.pool).await?;
        let rows = fetch::<DB>(&mut conn, &self.sql.is_paused, &[], None).await?;
        let paused = rows.first().map(|row| DB::int(row, 0)).transpose();
        Ok(paused.map_err(error::<DB>)?.flatten().unwrap_or(0) > 0)
    }
}

/// The key a listing starts after: the cursor's (a store key as printed), or none.
fn after(cursor: Option<&str>) -> Result<&str, StoreError> {
    match cursor {
        None => Ok(""),
        Some(cursor) => match StoreKey::parse(cursor) {
            Some(_) => Ok(cursor),
            None => Err(StoreError::with_source(
                StoreErrorKind::Other,
                "a listing's cursor that is not a store key",
            )),
        },
    }
}

/// The parameters of [`Statements::list`] and [`Statements::requeue_matching`].
fn filter_params<'a>(
    filter: &'a Filter,
    after: &'a str,
    now: i64,
    limit: usize,
    state: Option<&'a str>,
) -> [Param<'a>; 9] {
    [
        Param::Text(after),
        Param::Int(now),
        Param::Int(i64::try_from(limit).unwrap_or(i64::MAX)),
        Param::MaybeText(state),
        Param::MaybeText(filter.id_prefix.as_deref()),
        Param::MaybeText(filter.route.as_deref()),
        Param::MaybeText(filter.object.as_ref().map(ObjectKey::as_str)),
        Param::MaybeText(filter.correlation_id.as_deref()),
        Param::MaybeText(filter.error_contains.as_deref()),
    ]
}

/// The key in the first column of `row`, as printed.
fn row_key<DB: Dialect>(row: &DB::Row) -> Result<String, StoreError> {
    let key = DB::text(row, 0).map_err(error::<DB>)?;
    Ok(key.unwrap_or_default().to_owned())
}

/// What an operator sees of the row (as [`INFO_COLUMNS`]); `None` for a done key past its
/// retention at `now` (milliseconds), which counts as absent.
fn info<DB: Dialect>(row: &DB::Row, now: i64) -> Result<Option<EntryInfo>, StoreError> {
    let text = |column| DB::text(row, column).map_err(error::<DB>);
    let int = |column| DB::int(row, column).map_err(error::<DB>);
    let entry = entry::<DB>(row)?;
    let state = key_state(text(12)?.unwrap_or_default())?;
    let (until, dead) = match state {
        KeyState::Queued => (Some(entry.next_attempt_at), None),
        KeyState::Running => (int(13)?.map(from_epoch_ms), None),
        KeyState::Dead => (None, text(15)?.map(str::to_owned)),
        KeyState::Done => match int(14)? {
            Some(expires) if expires > now => (Some(from_epoch_ms(expires)), None),
            _ => return Ok(None),
        },
    };
    let stored = text(16)?.unwrap_or_default();
    // The attempt that runs is not in the stored lines (a take writes no text): its line is
    // made here, as the take would have appended it.
    let running = match (state, int(17)?) {
        (KeyState::Running, Some(started)) => {
            let at = UNIX_EPOCH + Duration::from_micros(u64::try_from(started).unwrap_or(0));
            let worker = text(18)?.unwrap_or_default();
            Some(history::push(
                stored,
                &history::started(entry.attempts, at, worker),
            ))
        }
        _ => None,
    };
    let stored = running.as_deref().unwrap_or(stored);
    Ok(Some(EntryInfo::of(entry, state, until, stored, dead)))
}

/// The stored name of `state`.
fn state_name(state: KeyState) -> &'static str {
    match state {
        KeyState::Queued => "queued",
        KeyState::Running => "running",
        KeyState::Dead => "dead",
        KeyState::Done => "done",
    }
}
