//! One client connection: the handshake, then pipelined requests.
//!
//! The reader decodes frames and starts one task per request (at most
//! `max_inflight_per_connection` at once); each task routes its request and
//! hands the encoded reply to the writer, which sends whatever replies are
//! ready in one write. A frame that does not decode, an oversized frame or a
//! failed login gets one error frame (request id 0) and closes this
//! connection; nothing else is affected. Before its login a connection has
//! a small frame limit ([`handshake::PRE_AUTH_BODY_MAX_BYTES`]) and
//! [`HANDSHAKE_TIMEOUT`]; after it, one that sends nothing for
//! `[limits] idle_timeout_s` with none of its requests running is closed.

use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferrite_proto::rpc::{self, ErrorCode, FrameHeader, MessageType, Reply, Request, HEADER_BYTES};
use ferrite_proto::FormatError;
use futures::channel::mpsc;
use futures::future::Either;
use futures::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use futures::{SinkExt, StreamExt};

use super::bulk::BulkRegion;
use super::{handshake, route, Shared};

/// Replies gathered into one write, at most.
const WRITE_BATCH_BYTES: usize = 256 << 10;
/// A connection must complete its login within this time.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Read buffer per connection.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// Most pipelined fetches found read in together that run as one batch.
const FETCH_BURST_MAX: usize = 64;

/// How the client reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Tcp,
    Unix,
}

/// Why reading a frame stopped.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The peer closed or the socket failed: close without a reply.
    Gone,
    /// The peer broke the protocol: reply with this code, then close.
    Refused(ErrorCode, String),
}

impl FrameError {
    pub(crate) fn malformed(e: FormatError) -> Self {
        let code = match e {
            FormatError::Range {
                field: "body_len", ..
            } => ErrorCode::Oversized,
            _ => ErrorCode::Malformed,
        };
        Self::Refused(code, e.to_string())
    }
}

/// Reads one frame header; `Ok(None)` on a clean end of stream.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: usize,
) -> Result<Option<FrameHeader>, FrameError> {
    let mut head = [0u8; HEADER_BYTES];
    let mut got = 0;
    while got < HEADER_BYTES {
        match r.read(&mut head[got..]).await {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) | Err(_) => return Err(FrameError::Gone),
            Ok(n) => got += n,
        }
    }
    let header = FrameHeader::decode(&head, max_body).map_err(FrameError::malformed)?;
    Ok(Some(header))
}

/// Reads the body announced by `header` and decodes it as a request.
pub(crate) async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    header: &FrameHeader,
) -> Result<Request, FrameError> {
    let mut body = vec![0u8; header.body_len as usize];
    r.read_exact(&mut body)
        .await
        .map_err(|_| FrameError::Gone)?;
    rpc::decode_request(header, &body).map_err(FrameError::malformed)
}

/// Reads one request frame and decodes it; `Ok(None)` on a clean end.
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: usize,
) -> Result<Option<(FrameHeader, Request)>, FrameError> {
    let Some(header) = read_header(r, max_body).await? else {
        return Ok(None);
    };
    Ok(Some((header, read_body(r, &header).await?)))
}

/// Sends the closing error frame (request id 0), best effort.
pub(crate) async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, code: ErrorCode, message: &str) {
    tracing::debug!(?code, message, "closing connection");
    let mut out = Vec::new();
    rpc::encode_reply(
        MessageType::Error,
        0,
        &Reply::error(code, message),
        &mut out,
    );
    let _ = w.write_all(&out).await;
    let _ = w.flush().await;
    let _ = w.close().await;
}

/// Serves one connection until the peer leaves, breaks the protocol or
/// stays idle past `idle_timeout`.
pub(crate) async fn serve<S>(stream: S, fd: RawFd, shared: Arc<Shared>, transport: Transport)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (rd, mut wr) = stream.split();
    let _slot = match ConnectionSlot::take(&shared) {
        Some(slot) => slot,
        None => {
            let message = format!("more than {} connections", shared.max_connections);
            refuse(&mut wr, ErrorCode::NoSpace, &message).await;
            return;
        }
    };
    let mut rd = BufReader::with_capacity(READ_BUFFER_BYTES, rd);
    let handshake = {
        let run = handshake::run(&mut rd, &mut wr, fd, &shared, transport);
        let deadline = glommio::timer::sleep(HANDSHAKE_TIMEOUT);
        futures::pin_mut!(run, deadline);
        match futures::future::select(run, deadline).await {
            Either::Left((outcome, _)) => outcome,
            Either::Right(_) => Err(FrameError::Refused(
                ErrorCode::Unauthenticated,
                format!("no login within {HANDSHAKE_TIMEOUT:?}"),
            )),
        }
    };
    // The client's bulk region, if it offered one we mapped: unmapped once
    // this connection ends and the last request task holding it finished.
    match handshake {
        Ok(bulk) => serve_requests(rd, wr, shared, bulk).await,
        Err(FrameError::Refused(code, message)) => refuse(&mut wr, code, &message).await,
        Err(FrameError::Gone) => {}
    }
}

/// Reads requests after the login and starts a task for each (or each
/// burst of fetches); ends when the peer leaves, breaks the protocol or
/// stays idle, and the replies still running are written.
async fn serve_requests<R, W>(
    mut rd: BufReader<R>,
    wr: W,
    shared: Arc<Shared>,
    bulk: Option<Arc<BulkRegion>>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + 'static,
{
    let max_body = shared.max_frame_bytes;
    let inflight = shared.max_inflight;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(inflight);
    let writer = glommio::spawn_local(write_loop(wr, rx));
    let permits = Rc::new(glommio::sync::Semaphore::new(inflight as u64));
    let idle = shared.idle_timeout;
    let fatal = loop {
        if !input_within(&mut rd, idle, &permits, inflight).await {
            let idle = idle.unwrap_or_default();
            break Some((
                ErrorCode::ShuttingDown,
                format!("idle for {idle:?}: closed"),
            ));
        }
        let (header, req) = match read_request(&mut rd, max_body).await {
            Ok(Some(frame)) => frame,
            Ok(None) | Err(FrameError::Gone) => break None,
            Err(FrameError::Refused(code, message)) => break Some((code, message)),
        };
        if matches!(req, Request::Hello(_) | Request::Login(_)) {
            break Some((ErrorCode::Malformed, "handshake repeated".to_string()));
        }
        let Ok(permit) = permits.acquire_static_permit(1).await else {
            break None;
        };
        let mut burst = vec![(header.request_id, req)];
        let mut held = vec![permit];
        if matches!(burst[0].1, Request::Fetch { .. }) {
            gather_fetches(&mut rd, &permits, max_body, &mut burst, &mut held);
        }
        let tx = tx.clone();
        let shared = shared.clone();
        let bulk = bulk.clone();
        glommio::spawn_local(async move {
            answer(&shared, burst, bulk.as_ref(), tx).await;
            drop(held);
        })
        .detach();
    };
    if let Some((code, message)) = fatal {
        tracing::debug!(?code, message, "closing connection");
        // Stop the replies still running from reaching the peer after the
        // error: the peer must see the error as the last frame.
        let mut out = Vec::new();
        rpc::encode_reply(
            MessageType::Error,
            0,
            &Reply::error(code, &message),
            &mut out,
        );
        let mut tx = tx.clone();
        let _ = tx.send(out).await;
        tx.close_channel();
    }
    drop(tx);
    writer.await;
}

/// Takes the whole, well-formed fetches already read in behind the first
/// one of `burst` into it (while permits are free): they go to their
/// targets with it as one batch, with no waiting for more to arrive.
fn gather_fetches<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    permits: &Rc<glommio::sync::Semaphore>,
    max_body: usize,
    burst: &mut Vec<(u64, Request)>,
    held: &mut Vec<glommio::sync::StaticPermit>,
) {
    while burst.len() < FETCH_BURST_MAX {
        let Some((id, fetch, len)) = buffered_fetch(rd.buffer(), max_body) else {
            break;
        };
        let Ok(permit) = permits.try_acquire_static_permit(1) else {
            break;
        };
        std::pin::Pin::new(&mut *rd).consume(len);
        burst.push((id, fetch));
        held.push(permit);
    }
}

/// Waits until the peer sends its next bytes (or closes): false when it
/// stayed silent for `idle` while none of its requests ran (all
/// `inflight` permits free). Waiting on the buffer's refill takes nothing
/// from the stream, so giving up mid-wait loses no bytes.
async fn input_within<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    idle: Option<Duration>,
    permits: &glommio::sync::Semaphore,
    inflight: usize,
) -> bool {
    let Some(idle) = idle else {
        return true;
    };
    if !rd.buffer().is_empty() {
        return true;
    }
    loop {
        let input = rd.fill_buf();
        let timer = glommio::timer::sleep(idle);
        futures::pin_mut!(input, timer);
        match futures::future::select(input, timer).await {
            Either::Left(_) => return true,
            Either::Right(_) if permits.available() == inflight as u64 => return false,
            Either::Right(_) => {}
        }
    }
}

/// The frame at the start of `buffered`, if it is there whole and is a
/// well-formed Fetch: its request id, the request and the frame's length.
/// Anything else is left for [`read_request`] (and its errors).
fn buffered_fetch(buffered: &[u8], max_body: usize) -> Option<(u64, Request, usize)> {
    let header = FrameHeader::decode(buffered.get(..HEADER_BYTES)?, max_body).ok()?;
    if header.kind != MessageType::Fetch {
        return None;
    }
    let end = HEADER_BYTES + header.body_len as usize;
    let req = rpc::decode_request(&header, buffered.get(HEADER_BYTES..end)?).ok()?;
    Some((header.request_id, req, end))
}

/// Runs `requests` (one, or a burst of fetches run as one batch) and hands
/// their encoded replies, each under its request id, to the writer at once.
async fn answer(
    shared: &Arc<Shared>,
    requests: Vec<(u64, Request)>,
    bulk: Option<&Arc<BulkRegion>>,
    mut tx: mpsc::Sender<Vec<u8>>,
) {
    let kinds: Vec<(MessageType, u64)> = requests.iter().map(|(id, r)| (r.kind(), *id)).collect();
    let items: Vec<Request> = requests.into_iter().map(|(_, r)| r).collect();
    let replies = match <[Request; 1]>::try_from(items) {
        Ok([req]) => vec![route::execute(shared, req, bulk).await],
        Err(items) => route::execute_batch(shared, items, bulk).await,
    };
    let mut out = Vec::with_capacity(replies.iter().map(encoded_size_hint).sum());
    for ((kind, id), reply) in kinds.into_iter().zip(&replies) {
        rpc::encode_reply(kind, id, reply, &mut out);
    }
    let _ = tx.send(out).await;
}

/// About how many bytes `reply` encodes to, so that a big value's frame is
/// allocated once instead of grown by doubling.
fn encoded_size_hint(reply: &Reply) -> usize {
    const OVERHEAD: usize = 64;
    match reply {
        Reply::Value(Some(f)) => HEADER_BYTES + OVERHEAD + f.value.len(),
        Reply::Data(d) => HEADER_BYTES + OVERHEAD + d.len(),
        Reply::Batch(items) => items.iter().map(encoded_size_hint).sum::<usize>() + OVERHEAD,
        _ => HEADER_BYTES + OVERHEAD,
    }
}

/// One of the engine's `max_connections`, given back on drop.
struct ConnectionSlot(Arc<Shared>);

impl ConnectionSlot {
    fn take(shared: &Arc<Shared>) -> Option<Self> {
        let before = shared.connections.fetch_add(1, Ordering::SeqCst);
        let slot = Self(shared.clone());
        (before < shared.max_connections).then_some(slot)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Writes replies as they come, several per write when they are ready
/// together; ends when every sender is gone or the socket fails.
async fn write_loop<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<Vec<u8>>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH_BYTES);
    while let Some(frame) = rx.next().await {
        batch.clear();
        batch.extend_from_slice(&frame);
        while batch.len() < WRITE_BATCH_BYTES {
            match rx.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                _ => break,
            }
        }
        if w.write_all(&batch).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.close().await;
}
