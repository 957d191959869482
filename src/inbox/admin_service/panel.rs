//! The page's requests: `GET /` (the index, an entry's page, a confirmation) and `POST /`
//! (its forms), answered with HTML or a 303 back to the page with a message.

use std::time::SystemTime;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;

use super::json::Refusal;
use super::page::{self, Index};
use super::params::Flash;
use super::{AdminService, Fate, html, params};
use crate::inbox::admin::InboxAdmin;
use crate::inbox::{Filter, KeyState};
use crate::stats;
use crate::store::StoreKey;

/// How many dead letters a confirmation counts at most (pages of [`params::REQUEUE`]).
const MOST_COUNTED: u64 = 100_000;

impl<I: InboxAdmin + Clone> AdminService<I> {
    /// `GET /`: the index, an entry's page (`entry`) or a confirmation (`confirm`).
    pub(super) async fn page(&self, query: &str) -> Result<Response<Full<Bytes>>, Refusal> {
        let asked = params::page(query)?;
        let (filter, cursor, limit) = params::listing(&asked.listing, params::LIST)?;
        let settings = &self.settings;
        let csrf = settings.csrf.token();
        let flash = asked.flash.as_ref().map(Flash::text);
        let flash = flash.as_deref();
        if let Some(key) = &asked.entry {
            let key = StoreKey::parse(key)
                .ok_or_else(|| Refusal::BadParameter("`entry` is not a store key".to_owned()))?;
            let info = self.inbox.find(&key).await?.ok_or(Refusal::NoEntry)?;
            let (bodies, actions) = (settings.show_bodies, settings.actions);
            let now = SystemTime::now();
            return Ok(html_ok(page::entry(
                &info, bodies, actions, &csrf, flash, now,
            )));
        }
        if asked.confirm {
            let (count, more) = self.count_dead(&filter).await?;
            let actions = settings.actions;
            return Ok(html_ok(page::confirm(
                &asked.filter,
                count,
                more,
                &csrf,
                actions,
            )));
        }
        let minute = stats::now_minute();
        let routes: Vec<_> = (stats::routes().iter())
            .map(|stats| (stats.namespace().to_owned(), stats.window(minute)))
            .collect();
        let counts = self.inbox.counts().await?;
        let paused = self.inbox.is_paused().await?;
        let retries = self.retries().await?;
        let page = self.inbox.list(&filter, cursor.as_deref(), limit).await?;
        let next = page.next.as_deref().map(|next| {
            let cursor = html::query([("cursor", params::seal_cursor(next).as_str())]);
            match asked.filter.query() {
                filter if filter.is_empty() => cursor,
                filter => format!("{filter}&{cursor}"),
            }
        });
        let index = Index {
            routes: &routes,
            minute,
            counts: &counts,
            paused,
            retries,
            filter: &asked.filter,
            page: &page,
            next,
            actions: settings.actions,
            csrf: &csrf,
            flash,
            now: SystemTime::now(),
        };
        Ok(html_ok(page::index(&index)))
    }

    /// The queued entries that failed before, in one page of the queue; whether there are
    /// more queued entries than that page.
    async fn retries(&self) -> Result<(u64, bool), Refusal> {
        let queued = Filter {
            state: Some(KeyState::Queued),
            ..Filter::default()
        };
        let page = (self.inbox).list(&queued, None, params::REQUEUE.0).await?;
        let failed = (page.entries.iter()).filter(|info| info.last_error.is_some());
        Ok((failed.count() as u64, page.next.is_some()))
    }

    /// How many dead letters match `filter` (whatever state it names); whether there were
    /// more than [`MOST_COUNTED`].
    async fn count_dead(&self, filter: &Filter) -> Result<(u64, bool), Refusal> {
        let dead = Filter {
            state: Some(KeyState::Dead),
            ..filter.clone()
        };
        let (mut count, mut cursor) = (0, None);
        loop {
            let page = (self.inbox)
                .list(&dead, cursor.as_deref(), params::REQUEUE.1)
                .await?;
            count += page.entries.len() as u64;
            cursor = page.next;
            match cursor {
                None => return Ok((count, false)),
                Some(_) if count >= MOST_COUNTED => return Ok((count, true)),
                Some(_) => {}
            }
        }
    }

    /// `POST /`: the form's action (`do`), then 303 back to the page it came from (`back`)
    /// with what was done.
    pub(super) async fn act(
        &self,
        form: &[(String, String)],
        query: &str,
        actor: &str,
    ) -> Result<Response<Full<Bytes>>, Refusal> {
        let field = |name: &str| {
            form.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let key = || {
            (field("key").and_then(StoreKey::parse))
                .ok_or_else(|| Refusal::BadParameter("`key` is not a store key".to_owned()))
        };
        let on_dead = async |fate: Fate, done: fn(StoreKey) -> Flash| {
            let key = key()?;
            let action = match fate {
                Fate::Requeue => "requeue",
                Fate::Discard => "discard",
            };
            let answer = self.on_dead_letter(key.clone(), fate, "", actor);
            match self.logged(action, actor, answer).await {
                Ok(_) => Ok(done(key)),
                Err(Refusal::NotDead) => Ok(Flash::NotDead(key)),
                Err(refusal) => Err(refusal),
            }
        };
        let flash = match field("do").unwrap_or_default() {
            "requeue" => on_dead(Fate::Requeue, Flash::Requeued).await?,
            "discard" => on_dead(Fate::Discard, Flash::Discarded).await?,
            "pause" => {
                let answer = self.set_paused(true, "", actor);
                self.logged("pause", actor, answer).await?;
                Flash::Paused
            }
            "resume" => {
                let answer = self.set_paused(false, "", actor);
                self.logged("resume", actor, answer).await?;
                Flash::Resumed
            }
            "requeue_matching" => {
                let answer = self.requeue_all(query, actor);
                let requeued = self.logged("requeue_matching", actor, answer).await?;
                Flash::RequeuedMatching(requeued)
            }
            _ => return Err(Refusal::BadParameter("`do` names no action".to_owned())),
        };
        Ok(see_other(field("back").unwrap_or_default(), &flash))
    }

    /// Re-queues every dead letter matching the query's filter, page after page.
    async fn requeue_all(&self, query: &str, actor: &str) -> Result<u64, Refusal> {
        let (filter, _, limit) = params::listing(query, params::REQUEUE)?;
        // Logged as it starts: a request dropped half way (a proxy's timeout, a closed tab)
        // leaves what it re-queued attributed to its actor.
        tracing::info!(
            actor,
            action = "requeue_matching",
            filter = %params::describe(&filter),
            "inbox admin: re-queueing every matching dead letter"
        );
        let (mut requeued, mut cursor) = (0, None::<String>);
        loop {
            let done = (self.inbox)
                .requeue_matching(&filter, cursor.as_deref(), limit)
                .await?;
            requeued += done.requeued;
            cursor = done.next;
            if cursor.is_none() {
                break;
            }
        }
        tracing::info!(
            actor,
            action = "requeue_matching",
            filter = %params::describe(&filter),
            requeued,
            "inbox admin: every matching dead letter re-queued"
        );
        Ok(requeued)
    }
}

/// 200 with a page: not cached, not framed by another site.
fn html_ok(page: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(page)));
    let headers = response.headers_mut();
    let html = HeaderValue::from_static("text/html; charset=utf-8");
    headers.insert(CONTENT_TYPE, html);
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    response
}

/// 303 to the page of query `back` (kept only if it is a plain query string) with `flash`.
fn see_other(back: &str, flash: &Flash) -> Response<Full<Bytes>> {
    let plain = back
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"%=&._~+-:".contains(&b));
    let back = if plain { back } else { "" };
    let flash = flash.query();
    let location = match back {
        "" => format!("?{flash}"),
        back => format!("?{back}&{flash}"),
    };
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(location) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
}
