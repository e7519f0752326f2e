//! Ranks in separate processes or machines, joined over TCP the way torchrun starts them: a
//! rank, a world size and rank 0's address ([`TcpGroup::connect`]; ortbench's worker reads
//! them from torchrun's, srun's or mpirun's variables: `bench/src/launch_env.rs`).
//!
//! Rank 0 listens on MASTER_ADDR:MASTER_PORT and every other rank connects to it (a star, as
//! torch.distributed's TCPStore). On CPU this is the data path of the collectives — gloo's role
//! in PyTorch; with NCCL it is the store through which ranks exchange the NCCL unique id.
//! Reductions happen on rank 0 in rank order 0..N with f64 accumulation, exactly as
//! [`super::LocalGroup`] does, so both transports give bit-identical results.
//!
//! The reductions (all-reduce, in-place reduce-scatter) stream in lockstep chunks of
//! [`STREAM_CHUNK`] elements: each rank sends a chunk of its buffer, rank 0 reduces it and
//! answers each rank its part of that chunk, which lands in the rank's own buffer. No rank copies
//! its buffer, and rank 0 holds N−1 chunks beside its own buffer rather than every rank's whole
//! buffer — what keeps DDP and ZeRO-1 over TCP from costing rank 0 N gradient-sized buffers.
//! The in-place all-gather reads each rank's chunk straight into its place in rank 0's buffer
//! and sends that buffer back: nothing beyond the ranks' own buffers either.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{check_chunks, chunk, Abortable, Collective, CollectiveError, Element, ReduceOp};

/// How long a rank waits for the others to connect (they load the model first).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a rank waits for a peer inside a collective on the CPU (`--collective-timeout-s`).
/// Every rank does the same work between collectives, so what a rank waits for there is the
/// other ranks' lag plus the transfer — seconds on one machine. Two minutes leaves room for a
/// rank descheduled on a loaded machine and still ends a stopped or hung peer's run five times
/// sooner than torch's 10-minute default, which is sized for NCCL's queued GPU work.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum OpCode {
    AllReduceSum = 1,
    AllReduceAvg = 2,
    AllReduceMax = 3,
    ReduceScatterSum = 4,
    ReduceScatterAvg = 5,
    ReduceScatterMax = 6,
    AllGather = 7,
    Broadcast = 8,
    Barrier = 9,
    ReduceScatterInPlaceSum = 10,
    ReduceScatterInPlaceAvg = 11,
    ReduceScatterInPlaceMax = 12,
    AllGatherInPlace = 13,
}

fn in_place_scatter_code(op: ReduceOp) -> OpCode {
    match op {
        ReduceOp::Sum => OpCode::ReduceScatterInPlaceSum,
        ReduceOp::Avg => OpCode::ReduceScatterInPlaceAvg,
        ReduceOp::Max => OpCode::ReduceScatterInPlaceMax,
    }
}

fn reduce_code(op: ReduceOp, scatter: bool) -> OpCode {
    match (op, scatter) {
        (ReduceOp::Sum, false) => OpCode::AllReduceSum,
        (ReduceOp::Avg, false) => OpCode::AllReduceAvg,
        (ReduceOp::Max, false) => OpCode::AllReduceMax,
        (ReduceOp::Sum, true) => OpCode::ReduceScatterSum,
        (ReduceOp::Avg, true) => OpCode::ReduceScatterAvg,
        (ReduceOp::Max, true) => OpCode::ReduceScatterMax,
    }
}

/// One rank of a TCP group.
pub struct TcpGroup {
    rank: usize,
    world: usize,
    /// Rank 0: a stream to each rank 1..N (index r-1). Others: one stream to rank 0.
    peers: Mutex<Vec<TcpStream>>,
    /// The read and write deadline of every socket operation inside a collective.
    timeout: Duration,
    /// Handles on the same sockets outside the lock a running collective holds, so that
    /// [`Abortable::abort`] can shut them down under it.
    shutters: Vec<TcpStream>,
    aborted: AtomicBool,
}

fn io(what: &str) -> impl Fn(std::io::Error) -> CollectiveError + '_ {
    move |e| CollectiveError::Io(format!("{what}: {e}"))
}

fn as_bytes<T: Element>(x: &[T]) -> &[u8] {
    // SAFETY: every Element (f32, f64, f16, bf16, u8) is plain old data without padding.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

fn as_bytes_mut<T: Element>(x: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is a valid value of these types.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

fn send_msg(s: &mut TcpStream, code: u8, len: u64, payload: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = code;
    head[1..].copy_from_slice(&len.to_le_bytes());
    s.write_all(&head)?;
    s.write_all(payload)
}

fn recv_head(s: &mut TcpStream) -> std::io::Result<(u8, u64)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    Ok((head[0], u64::from_le_bytes(head[1..].try_into().expect("8 bytes"))))
}

/// Elements per chunk of a streamed reduction (1 MiB of f32; small in the unit tests so that
/// buffers span several chunks, one partial).
#[cfg(not(test))]
const STREAM_CHUNK: usize = 1 << 18;
#[cfg(test)]
const STREAM_CHUNK: usize = 7;

/// The longest error text rank 0 may send (a longer one is a broken peer, not read).
const MAX_ERROR_BYTES: u64 = 64 << 10;

/// Status byte of rank 0's answers.
const OK: u8 = 0;
const ERR: u8 = 1;

impl TcpGroup {
    fn new(
        rank: usize,
        world: usize,
        peers: Vec<TcpStream>,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        let shutters = peers.iter().map(TcpStream::try_clone).collect::<Result<_, _>>();
        Ok(TcpGroup {
            rank,
            world,
            peers: Mutex::new(peers),
            timeout,
            shutters: shutters.map_err(io("socket"))?,
            aborted: AtomicBool::new(false),
        })
    }

    /// The peers' streams for one collective (`op`), unless the group was aborted.
    fn lock_peers(
        &self,
        op: &'static str,
    ) -> Result<std::sync::MutexGuard<'_, Vec<TcpStream>>, CollectiveError> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(CollectiveError::Aborted(op));
        }
        self.peers.lock().map_err(|_| CollectiveError::Poisoned(op))
    }

    /// Sets how long a collective waits for a peer (read or write) before it fails with
    /// [`CollectiveError::Timeout`] naming that peer.
    pub fn with_collective_timeout(self, timeout: Duration) -> Result<Self, CollectiveError> {
        if timeout.is_zero() {
            return Err(CollectiveError::Env("the collective timeout must be positive".into()));
        }
        for s in self.lock_peers("collective")?.iter() {
            s.set_read_timeout(Some(timeout)).map_err(io("socket"))?;
            s.set_write_timeout(Some(timeout)).map_err(io("socket"))?;
        }
        Ok(TcpGroup { timeout, ..self })
    }

    /// The error of a socket operation with `peer` inside `code`: a timeout names the silent
    /// peer; anything else (a closed socket: the peer died) says what was being done.
    fn peer_err(
        &self,
        code: OpCode,
        peer: usize,
        what: &'static str,
    ) -> impl Fn(std::io::Error) -> CollectiveError + '_ {
        move |e| match e.kind() {
            // SO_RCVTIMEO/SO_SNDTIMEO expiring reads as EAGAIN (WouldBlock) on Linux.
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                CollectiveError::Timeout {
                    collective: format!("{code:?}"),
                    rank: peer,
                    after: self.timeout,
                }
            }
            _ => CollectiveError::Io(format!("{code:?}: {what} rank {peer}: {e}")),
        }
    }

    /// Rank 0 binds `addr` and waits for the others; rank r > 0 connects to it (retrying until
    /// `timeout`, since rank 0 may start later).
    pub fn connect(
        rank: usize,
        world: usize,
        addr: &str,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        if world == 0 || rank >= world {
            return Err(CollectiveError::Env(format!(
                "RANK {rank} is not below WORLD_SIZE {world}"
            )));
        }
        if rank == 0 {
            let listener =
                TcpListener::bind(addr).map_err(io("binding MASTER_ADDR:MASTER_PORT"))?;
            return Self::root(listener, world, timeout);
        }
        let target: SocketAddr = addr
            .to_socket_addrs()
            .map_err(io("resolving MASTER_ADDR"))?
            .next()
            .ok_or_else(|| CollectiveError::Env(format!("{addr} resolves to no address")))?;
        let start = Instant::now();
        let mut stream = loop {
            match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
                Ok(s) => break s,
                Err(e) if start.elapsed() < timeout => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(CollectiveError::Io(format!(
                        "rank {rank}: cannot reach rank 0 at {addr}: {e}"
                    )))
                }
            }
        };
        stream.set_nodelay(true).map_err(io("socket"))?;
        stream.set_read_timeout(Some(timeout)).map_err(io("socket"))?;
        send_msg(&mut stream, 0, rank as u64, &(world as u64).to_le_bytes())
            .map_err(io("handshake"))?;
        TcpGroup::new(rank, world, vec![stream], timeout)
    }

    /// Rank 0 of a group whose other ranks connect to `listener`.
    pub fn root(
        listener: TcpListener,
        world: usize,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        let mut slots: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        listener.set_nonblocking(true).map_err(io("listener"))?;
        let start = Instant::now();
        while slots.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).map_err(io("socket"))?;
                    s.set_nodelay(true).map_err(io("socket"))?;
                    s.set_read_timeout(Some(timeout)).map_err(io("socket"))?;
                    let (_, r) = recv_head(&mut s).map_err(io("handshake"))?;
                    let mut w = [0u8; 8];
                    s.read_exact(&mut w).map_err(io("handshake"))?;
                    let (r, w) = (r as usize, u64::from_le_bytes(w) as usize);
                    if w != world || r == 0 || r >= world || slots[r - 1].is_some() {
                        return Err(CollectiveError::Env(format!("a peer claims RANK {r} of WORLD_SIZE {w}; this group has {world} ranks")));
                    }
                    slots[r - 1] = Some(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() > timeout {
                        let missing: Vec<usize> = slots
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(i, _)| i + 1)
                            .collect();
                        return Err(CollectiveError::Io(format!(
                            "rank 0: ranks {missing:?} did not connect within {timeout:?}"
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(CollectiveError::Io(format!("rank 0: accept: {e}"))),
            }
        }
        let peers = slots.into_iter().map(|s| s.expect("all connected")).collect();
        TcpGroup::new(0, world, peers, timeout)
    }

    /// The generic exchange: every rank sends (code, its buffer) to rank 0; rank 0 validates
    /// lengths, computes each rank's answer with `answer(all inputs, rank)` and sends it back.
    fn exchange<T: Element>(
        &self,
        code: OpCode,
        input: &[T],
        expect_len: Option<usize>,
        output: &mut [T],
        answer: impl Fn(&[Vec<T>], usize, &mut [T]),
    ) -> Result<(), CollectiveError> {
        let mut peers = self.lock_peers("collective")?;
        let want = expect_len.unwrap_or(input.len());
        let inputs = self.collect(&mut peers, code, input, |_| want)?;
        let out_len = output.len();
        self.answer(code, &mut peers, inputs, output, |_| out_len, answer)
    }

    /// First half of an exchange: a rank > 0 sends `input` to rank 0 (None); rank 0 receives
    /// every rank's input, in rank order, and checks rank r's length against `expect_len(r)`
    /// (on a mismatch every rank gets the error). Split from [`TcpGroup::answer`] so that an
    /// in-place collective can send from and then receive into the same buffer.
    fn collect<T: Element>(
        &self,
        peers: &mut [TcpStream],
        code: OpCode,
        input: &[T],
        expect_len: impl Fn(usize) -> usize,
    ) -> Result<Option<Vec<Vec<T>>>, CollectiveError> {
        if self.rank != 0 {
            send_msg(&mut peers[0], code as u8, input.len() as u64, as_bytes(input))
                .map_err(self.peer_err(code, 0, "sending to"))?;
            return Ok(None);
        }
        let mut inputs: Vec<Vec<T>> = vec![input.to_vec()];
        for (i, s) in peers.iter_mut().enumerate() {
            let r = i + 1;
            let from = self.peer_err(code, r, "receiving from");
            let (c, len) = recv_head(s).map_err(&from)?;
            let want = expect_len(r);
            // The length is checked before anything is allocated or read: a peer that sends a
            // wrong or garbage header ends the collective with its rank named, and the stream
            // (now out of step) is not read further.
            if c != code as u8 || len != want as u64 {
                let msg = if c != code as u8 {
                    format!(
                        "rank {r} called collective {c} while rank 0 called {} ({code:?})",
                        code as u8
                    )
                } else {
                    format!("{code:?}: rank {r} sent {len} elements, expected {want}")
                };
                for s in peers.iter_mut() {
                    let _ = send_msg(s, ERR, msg.len() as u64, msg.as_bytes());
                }
                return Err(CollectiveError::Remote(msg));
            }
            let mut buf: Vec<T> = vec![input.first().copied().unwrap_or(T::from_f64(0.0)); want];
            s.read_exact(as_bytes_mut(&mut buf)).map_err(&from)?;
            inputs.push(buf);
        }
        Ok(Some(inputs))
    }

    /// Second half of an exchange: rank 0 computes rank r's answer (`answer_len(r)` elements)
    /// with `answer(inputs, r, out)`, sends it, and writes its own into `output`; a rank > 0
    /// receives its answer into `output`.
    fn answer<T: Element>(
        &self,
        code: OpCode,
        peers: &mut [TcpStream],
        inputs: Option<Vec<Vec<T>>>,
        output: &mut [T],
        answer_len: impl Fn(usize) -> usize,
        answer: impl Fn(&[Vec<T>], usize, &mut [T]),
    ) -> Result<(), CollectiveError> {
        let Some(inputs) = inputs else {
            return self.read_answer(code, &mut peers[0], output);
        };
        let mut ans = Vec::new();
        for (i, s) in peers.iter_mut().enumerate() {
            ans.clear();
            ans.resize(answer_len(i + 1), T::from_f64(0.0));
            answer(&inputs, i + 1, &mut ans);
            send_msg(s, OK, ans.len() as u64, as_bytes(&ans)).map_err(self.peer_err(
                code,
                i + 1,
                "answering",
            ))?;
        }
        answer(&inputs, 0, output);
        Ok(())
    }
}

impl TcpGroup {
    /// A reduction in place over `buf`, streamed in lockstep chunks (see the module comment):
    /// afterwards the part `part(r)` of rank r's `buf` holds the reduction of every rank's
    /// `buf` there (the whole buffer for an all-reduce, the rank's chunk for an in-place
    /// reduce-scatter); the rest of its `buf` is left as it was. Every rank passes the same
    /// `buf.len()` (checked on rank 0 before anything else is read: a mismatch is an error on
    /// every rank).
    fn reduce_streamed<T: Element>(
        &self,
        code: OpCode,
        buf: &mut [T],
        op: ReduceOp,
        part: impl Fn(usize) -> std::ops::Range<usize>,
    ) -> Result<(), CollectiveError> {
        let mut peers = self.lock_peers("collective")?;
        let len = buf.len();
        if self.rank != 0 {
            let s = &mut peers[0];
            let mine = part(self.rank);
            // The header alone; the data follows chunk by chunk.
            send_msg(s, code as u8, len as u64, &[]).map_err(self.peer_err(
                code,
                0,
                "sending to",
            ))?;
            let mut at = 0;
            loop {
                let end = (at + STREAM_CHUNK).min(len);
                s.write_all(as_bytes(&buf[at..end])).map_err(self.peer_err(
                    code,
                    0,
                    "sending to",
                ))?;
                self.read_answer(code, s, &mut buf[overlap(&mine, at, end)])?;
                at = end;
                if at >= len {
                    return Ok(());
                }
            }
        }
        // Every head first: a wrong collective or length from any rank ends it on every rank
        // before a byte of data is read or anything allocated.
        let mut bad = None;
        for (i, s) in peers.iter_mut().enumerate() {
            let r = i + 1;
            let (c, n) = recv_head(s).map_err(self.peer_err(code, r, "receiving from"))?;
            if c != code as u8 || n != len as u64 {
                bad = Some(mismatch(code, r, c, n, len));
                break;
            }
        }
        if let Some(msg) = bad {
            return Err(refuse(&mut peers, msg));
        }
        let world = self.world;
        let zero = T::from_f64(0.0);
        let mut theirs: Vec<Vec<T>> =
            (1..world).map(|_| Vec::with_capacity(STREAM_CHUNK.min(len))).collect();
        let mut reduced: Vec<T> = Vec::with_capacity(STREAM_CHUNK.min(len));
        let mine = part(0);
        let mut at = 0;
        loop {
            let end = (at + STREAM_CHUNK).min(len);
            for (i, (s, x)) in peers.iter_mut().zip(theirs.iter_mut()).enumerate() {
                x.clear();
                x.resize(end - at, zero);
                s.read_exact(as_bytes_mut(x)).map_err(self.peer_err(
                    code,
                    i + 1,
                    "receiving from",
                ))?;
            }
            // Rank order 0..N, f64 accumulation, one rounding: `reduce_at`'s arithmetic.
            reduced.clear();
            for (j, own) in buf[at..end].iter().enumerate() {
                let mut acc = own.to_f64();
                for x in &theirs {
                    let v = x[j].to_f64();
                    acc = if op == ReduceOp::Max { acc.max(v) } else { acc + v };
                }
                reduced.push(T::from_f64(if op == ReduceOp::Avg {
                    acc / world as f64
                } else {
                    acc
                }));
            }
            for (i, s) in peers.iter_mut().enumerate() {
                let o = overlap(&part(i + 1), at, end);
                send_msg(s, OK, o.len() as u64, as_bytes(&reduced[o.start - at..o.end - at]))
                    .map_err(self.peer_err(code, i + 1, "answering"))?;
            }
            let o = overlap(&mine, at, end);
            buf[o.clone()].copy_from_slice(&reduced[o.start - at..o.end - at]);
            at = end;
            if at >= len {
                return Ok(());
            }
        }
    }
}

/// What rank 0 says when rank `r`'s header (collective `c`, `n` elements) is not the one it
/// expects (collective `code`, `want` elements).
fn mismatch(code: OpCode, r: usize, c: u8, n: u64, want: usize) -> String {
    if c != code as u8 {
        format!("rank {r} called collective {c} while rank 0 called {} ({code:?})", code as u8)
    } else {
        format!("{code:?}: rank {r} sent {n} elements, expected {want}")
    }
}

/// Rank 0 ends a collective on every rank with `msg` (their streams, now out of step, are not
/// read further).
fn refuse(peers: &mut [TcpStream], msg: String) -> CollectiveError {
    for s in peers.iter_mut() {
        let _ = send_msg(s, ERR, msg.len() as u64, msg.as_bytes());
    }
    CollectiveError::Remote(msg)
}

/// The part of `p` inside the chunk `at..end` (empty: `at..at`).
fn overlap(p: &std::ops::Range<usize>, at: usize, end: usize) -> std::ops::Range<usize> {
    let (lo, hi) = (p.start.max(at), p.end.min(end));
    if lo < hi {
        lo..hi
    } else {
        at..at
    }
}

impl TcpGroup {
    /// Reads one answer of rank 0 to `code` into `out` (its length must be what rank 0 sends), or
    /// the error it sends instead.
    fn read_answer<T: Element>(
        &self,
        code: OpCode,
        s: &mut TcpStream,
        out: &mut [T],
    ) -> Result<(), CollectiveError> {
        let from = self.peer_err(code, 0, "waiting for");
        let (status, len) = recv_head(s).map_err(&from)?;
        if status == ERR {
            if len > MAX_ERROR_BYTES {
                return Err(CollectiveError::Io(format!(
                    "rank 0 sent an error message of {len} bytes"
                )));
            }
            let mut msg = vec![0u8; len as usize];
            s.read_exact(&mut msg).map_err(&from)?;
            return Err(CollectiveError::Remote(String::from_utf8_lossy(&msg).into_owned()));
        }
        if len as usize != out.len() {
            return Err(CollectiveError::Io(format!(
                "rank 0 answered {len} elements, expected {}",
                out.len()
            )));
        }
        s.read_exact(as_bytes_mut(out)).map_err(&from)
    }
}

fn reduce_at<T: Element>(inputs: &[Vec<T>], i: usize, op: ReduceOp) -> T {
    let mut acc = inputs[0][i].to_f64();
    for x in &inputs[1..] {
        let v = x[i].to_f64();
        acc = if op == ReduceOp::Max { acc.max(v) } else { acc + v };
    }
    T::from_f64(if op == ReduceOp::Avg { acc / inputs.len() as f64 } else { acc })
}

impl Collective for TcpGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CollectiveError> {
        let len = buf.len();
        self.reduce_streamed(reduce_code(op, false), buf, op, |_| 0..len)
    }

    fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let k = recv.len();
        if send.len() != self.world * k {
            return Err(CollectiveError::Size {
                op: "reduce_scatter",
                rank: self.rank,
                expected: self.world * k,
                got: send.len(),
            });
        }
        self.exchange(reduce_code(op, true), send, Some(send.len()), recv, |ins, r, out| {
            for (j, o) in out.iter_mut().enumerate() {
                *o = reduce_at(ins, r * k + j, op);
            }
        })
    }

    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollectiveError> {
        let k = send.len();
        if recv.len() != self.world * k {
            return Err(CollectiveError::Size {
                op: "all_gather",
                rank: self.rank,
                expected: self.world * k,
                got: recv.len(),
            });
        }
        self.exchange(OpCode::AllGather, send, Some(k), recv, |ins, _, out| {
            for (r, x) in ins.iter().enumerate() {
                out[r * k..(r + 1) * k].copy_from_slice(x);
            }
        })
    }

    fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let (len, world) = (buf.len(), self.world);
        check_chunks("reduce_scatter_in_place", self.rank, len, k, world)?;
        // Every rank streams its whole buffer; each gets back only its chunk.
        self.reduce_streamed(in_place_scatter_code(op), buf, op, |r| chunk(len, k, r))
    }

    fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
    ) -> Result<(), CollectiveError> {
        let (len, world) = (buf.len(), self.world);
        check_chunks("all_gather_in_place", self.rank, len, k, world)?;
        let mut peers = self.lock_peers("collective")?;
        let code = OpCode::AllGatherInPlace;
        // Each rank sends only its chunk and receives the whole buffer in place. Rank 0 reads
        // each chunk straight into its place in its own buffer, which then is the answer: no
        // memory beyond the ranks' buffers.
        if self.rank != 0 {
            let mine = chunk(len, k, self.rank);
            send_msg(&mut peers[0], code as u8, mine.len() as u64, as_bytes(&buf[mine]))
                .map_err(self.peer_err(code, 0, "sending to"))?;
            return self.read_answer(code, &mut peers[0], buf);
        }
        for r in 1..world {
            let want = chunk(len, k, r);
            let from = self.peer_err(code, r, "receiving from");
            let (c, n) = recv_head(&mut peers[r - 1]).map_err(&from)?;
            // Checked before anything is read: rank r's chunk must be chunk(len, k, r) long.
            if c != code as u8 || n != want.len() as u64 {
                return Err(refuse(&mut peers, mismatch(code, r, c, n, want.len())));
            }
            peers[r - 1].read_exact(as_bytes_mut(&mut buf[want])).map_err(&from)?;
        }
        for (i, s) in peers.iter_mut().enumerate() {
            send_msg(s, OK, len as u64, as_bytes(buf)).map_err(self.peer_err(
                code,
                i + 1,
                "answering",
            ))?;
        }
        Ok(())
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollectiveError> {
        if root >= self.world {
            return Err(CollectiveError::Root { root, world: self.world });
        }
        let input = buf.to_vec();
        self.exchange(OpCode::Broadcast, &input, None, buf, |ins, _, out| {
            out.copy_from_slice(&ins[root])
        })
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        let mut none: [u8; 0] = [];
        self.exchange(OpCode::Barrier, &[] as &[u8], Some(0), &mut none, |_, _, _| {})
    }
}

impl Abortable for TcpGroup {
    fn collective_timeout(&self) -> Duration {
        self.timeout
    }
    /// Shuts the sockets down: a read or write blocked on them returns at once, and the peers'
    /// reads see the connection end (they fail naming this rank rather than wait out theirs).
    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        for s in &self.shutters {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{chunk, LocalGroup, Sharding};
    use super::*;

    fn data(rank: usize, n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.1 - 0.77).collect()
    }

    /// Runs `f` on each rank of a TCP group on loopback (threads standing in for processes).
    fn on_tcp_ranks<R: Send>(world: usize, f: impl Fn(TcpGroup) -> R + Sync) -> Vec<R> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let t = Duration::from_secs(20);
        std::thread::scope(|s| {
            let f = &f;
            let root = s.spawn(move || f(TcpGroup::root(listener, world, t).unwrap()));
            let others: Vec<_> = (1..world)
                .map(|r| {
                    let addr = addr.clone();
                    s.spawn(move || f(TcpGroup::connect(r, world, &addr, t).unwrap()))
                })
                .collect();
            let mut out = vec![root.join().unwrap()];
            out.extend(others.into_iter().map(|h| h.join().unwrap()));
            out
        })
    }

    fn on_local_ranks<R: Send>(world: usize, f: impl Fn(LocalGroup) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let hs: Vec<_> = LocalGroup::new(world).into_iter().map(|g| s.spawn(|| f(g))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// What [`program`] returns: every collective's result.
    type Results = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<half::bf16>, Vec<f32>, Vec<f32>);

    /// The same sequence of collectives on any transport.
    fn program<C: Collective>(g: C) -> Results {
        let n = g.world_size();
        let mut a = data(g.rank(), 1001);
        g.all_reduce(&mut a, ReduceOp::Avg).unwrap();
        let mut send = data(g.rank(), 4 * n);
        send.iter_mut().for_each(|x| *x *= 3.0);
        let mut shard = vec![0.0; 4];
        g.reduce_scatter(&send, &mut shard, ReduceOp::Sum).unwrap();
        let mut gathered = vec![0.0; 4 * n];
        g.all_gather(&shard, &mut gathered).unwrap();
        g.barrier().unwrap();
        let mut b: Vec<half::bf16> =
            data(g.rank(), 9).into_iter().map(half::bf16::from_f32).collect();
        g.broadcast(&mut b, n - 1).unwrap();
        // In place on an unpadded buffer: 37 elements in ZeRO-1's shards (on 4 ranks: 16, 16,
        // 5 and an empty chunk).
        let k = Sharding::new(37, n, 16).shard;
        let mut flat = data(g.rank(), 37);
        g.reduce_scatter_in_place(&mut flat, k, ReduceOp::Avg).unwrap();
        let scattered = flat.clone();
        flat[chunk(37, k, g.rank())].iter_mut().for_each(|x| *x *= 2.0);
        g.all_gather_in_place(&mut flat, k).unwrap();
        (a, shard, gathered, b, scattered, flat)
    }

    #[test]
    fn tcp_ranks_compute_exactly_what_in_process_ranks_compute() {
        for world in 1..=4 {
            let tcp = on_tcp_ranks(world, program);
            let local = on_local_ranks(world, program);
            assert_eq!(tcp, local, "world {world}");
        }
    }

    #[test]
    fn in_place_collectives_with_mismatched_chunks_fail_on_every_rank() {
        // Rank 2 passes a longer buffer: the reduce-scatter's lengths differ.
        let out = on_tcp_ranks(3, |g| {
            let mut b = vec![1.0f32; 30 + 5 * (g.rank() / 2)];
            g.reduce_scatter_in_place(&mut b, 16, ReduceOp::Sum)
        });
        assert!(out.iter().all(|r| r.is_err()), "{out:?}");
        // Rank 1 cuts other chunks: its chunk's length is not the one rank 0 expects.
        let out = on_tcp_ranks(3, |g| {
            let mut b = vec![1.0f32; 30];
            g.all_gather_in_place(&mut b, if g.rank() == 1 { 12 } else { 10 })
        });
        assert!(out.iter().all(|r| r.is_err()), "{out:?}");
        // More elements than the chunks hold: refused before anything is sent.
        let e = on_tcp_ranks(2, |g| g.reduce_scatter_in_place(&mut [0f32; 9], 4, ReduceOp::Sum));
        assert!(e.iter().all(|r| matches!(r, Err(CollectiveError::Chunks { .. }))), "{e:?}");
    }

    #[test]
    fn mismatched_sizes_fail_on_every_rank() {
        let out = on_tcp_ranks(3, |g| {
            let mut b = vec![1.0f32; 5 + g.rank()];
            g.all_reduce(&mut b, ReduceOp::Sum)
        });
        for r in out {
            assert!(r.is_err(), "{r:?}");
        }
    }

    /// A peer that joins properly and then sends garbage: rank 0's collective ends with an error
    /// naming it, without allocating what the header claims and without panicking.
    #[test]
    fn a_peer_sending_garbage_is_an_error_naming_it() {
        for garbage in [
            // A header claiming 2^60 elements (an allocation of 4 EiB if trusted).
            {
                let mut h = vec![OpCode::AllReduceSum as u8];
                h.extend((1u64 << 60).to_le_bytes());
                h
            },
            // The wrong collective.
            {
                let mut h = vec![OpCode::Barrier as u8];
                h.extend(4u64.to_le_bytes());
                h
            },
            // A truncated header, then the connection closes.
            vec![OpCode::AllReduceSum as u8, 1, 2],
        ] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let peer = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                send_msg(&mut s, 0, 1, &2u64.to_le_bytes()).unwrap(); // handshake: rank 1 of 2
                s.write_all(&garbage).unwrap();
                std::thread::sleep(Duration::from_millis(200));
            });
            let g = TcpGroup::root(listener, 2, Duration::from_secs(10)).unwrap();
            let e = g.all_reduce(&mut [1.0f32; 4], ReduceOp::Sum).unwrap_err().to_string();
            assert!(e.contains("rank 1"), "{e}");
            peer.join().unwrap();
        }
        // A stray connection with a bad handshake is refused.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            send_msg(&mut s, 0, 7, &2u64.to_le_bytes()).unwrap(); // claims rank 7 of 2
            std::thread::sleep(Duration::from_millis(200));
        });
        let e = TcpGroup::root(listener, 2, Duration::from_secs(10)).err().unwrap().to_string();
        assert!(e.contains("RANK 7"), "{e}");
        peer.join().unwrap();
    }

    /// A peer that joins and then says nothing (a stopped process keeps its socket open):
    /// the collective fails after the collective timeout naming it, on rank 0 and on a rank
    /// waiting for rank 0 alike.
    #[test]
    fn a_silent_peer_ends_the_collective_after_the_timeout_naming_it() {
        let t = Duration::from_millis(300);
        for silent in [1usize, 0] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let join = |rank: usize, listener: Option<TcpListener>| match listener {
                Some(l) => TcpGroup::root(l, 2, Duration::from_secs(10)).unwrap(),
                None => TcpGroup::connect(rank, 2, &addr, Duration::from_secs(10)).unwrap(),
            };
            let (mut root_listener, talker) = (Some(listener), 1 - silent);
            let quiet_listener = if silent == 0 { root_listener.take() } else { None };
            let g = std::thread::scope(|s| {
                let join = &join;
                let quiet = s.spawn(move || {
                    let g = join(silent, quiet_listener);
                    // Holds the connection open, calling nothing, until the other rank gave up.
                    done_rx.recv().unwrap();
                    drop(g);
                });
                let g = join(talker, root_listener).with_collective_timeout(t).unwrap();
                let e = g.all_reduce(&mut [1.0f32; 4], ReduceOp::Sum).unwrap_err();
                done_tx.send(()).unwrap();
                quiet.join().unwrap();
                e
            });
            let e = g;
            assert!(
                matches!(&e, CollectiveError::Timeout { rank, collective, after }
                    if *rank == silent && collective == "AllReduceSum" && *after == t),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains(&format!("rank {silent} silent for 0.3 s")), "{msg}");
        }
    }

    /// An abort from another thread (the watchdog's) ends a collective blocked on a silent
    /// peer at once, long before the socket deadline, and every later collective.
    #[test]
    fn an_abort_ends_a_collective_blocked_on_a_silent_peer_and_all_later_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let quiet = std::thread::spawn(move || {
            let g = TcpGroup::connect(1, 2, &addr, Duration::from_secs(10)).unwrap();
            done_rx.recv().unwrap();
            drop(g);
        });
        let g = std::sync::Arc::new(TcpGroup::root(listener, 2, Duration::from_secs(60)).unwrap());
        // Not a scoped thread: an abort that fails to release it fails the test, not hangs it.
        let (tx, rx) = std::sync::mpsc::channel();
        let blocked = g.clone();
        std::thread::spawn(move || tx.send(blocked.all_reduce(&mut [1.0f32; 4], ReduceOp::Sum)));
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "returned without rank 1");
        g.abort();
        // Well before the 60 s socket deadline.
        let e = rx.recv_timeout(Duration::from_secs(10)).expect("still blocked").unwrap_err();
        assert!(e.to_string().contains("rank 1"), "{e}");
        assert_eq!(g.barrier().unwrap_err(), CollectiveError::Aborted("collective"));
        done_tx.send(()).unwrap();
        quiet.join().unwrap();
    }

    #[test]
    fn env_errors_are_clear() {
        let e = TcpGroup::connect(3, 2, "127.0.0.1:1", Duration::from_millis(10))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("RANK 3 is not below WORLD_SIZE 2"), "{e}");
        let e = TcpGroup::connect(1, 2, "127.0.0.1:1", Duration::from_millis(100))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cannot reach rank 0"), "{e}");
    }
}
