//! Namespaces of a run's own: what each confined process gets before Landlock closes over it.
//!
//! Between `fork` and `exec` (registered by [`confine`], with the workspace's only `unsafe`),
//! the child enters namespaces of its own — a normal user first enters a user namespace of its
//! own (its uid and gid mapped to themselves, so files keep their owners), which gives it the
//! right to make the others; root needs none — and in them:
//!
//! - **a network of its own** (unless the branch is not on this machine's loopback): only a
//!   loopback, brought up, on which its tests may listen and connect on any port. Nothing
//!   outside is reachable. At the branch's own address and port (`PGHOST`/`PGPORT` as the run's
//!   environment names them) the child opens a listener and hands it to Consort over a
//!   datagram pair; Consort accepts there and forwards each connection to the real branch
//!   ([`super::forward`]). So the branch works unchanged and nothing else does: not the parent
//!   database's port, not another run's branch or listener, not Consort's own services.
//! - **a mount namespace of its own**, in which `/dev/pts` is a fresh devpts instance (ptys of
//!   its own, nobody else's), `/dev/shm` is a directory of its scratch, and each dependency
//!   directory (`node_modules`, `.venv`) is mounted read-only, so no `chmod`, `utime`,
//!   `setxattr` or `truncate` reaches the test tools.
//!
//! Then Landlock is applied (mounts are no longer possible after it) and every capability is
//! dropped. [`probe`] tries all of it once per process; where the kernel refuses, runs keep
//! Landlock alone and its TCP port rule, and say so. An unconfined run (`sandbox = "off"`)
//! gets only the mount namespace with its dependency directories read-only
//! ([`Plan::unconfined`]).

use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, AccessFs, PathBeneath, RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus,
};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType, recvmsg, sendmsg, sendto, socket,
};
use nix::sys::stat::Mode;

/// What a run's processes get in their own namespaces (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Whether the child makes a user namespace of its own: a normal user's way to the
    /// others. Root makes none: it has the powers the mounts need, and drops them all after.
    new_user: bool,
    /// Whether the child is confined (ptys and `/dev/shm` of its own, capabilities dropped);
    /// `false` for a run with `sandbox = "off"`, which gets only its read-only dependencies.
    confined: bool,
    /// `"<uid> <uid> 1"`: the child's uid mapped to itself.
    uid_map: Vec<u8>,
    /// `"<gid> <gid> 1"`.
    gid_map: Vec<u8>,
    /// Whether the child gets a network of its own: not when its branch is on another
    /// machine (the run keeps the machine's network, and Landlock's TCP port rule holds).
    own_network: bool,
    /// Where the child listens for its branch in its own network (none when the branch is
    /// reached over a Unix socket, which no network namespace divides).
    branch_listen: Vec<SocketAddr>,
    /// Writable directories inside the read-only ones (the tools' caches), mounted writable
    /// again after them.
    writable_inside: Vec<(CString, MsFlags)>,
    /// The run's own `/dev/shm` (a directory of its scratch).
    shm: Option<CString>,
    /// Directories mounted read-only, with the flags their mounts already carry (a mount in a
    /// user namespace may not drop `nosuid`, `nodev`, `noexec`).
    read_only: Vec<(CString, MsFlags)>,
}

/// Why the child could not enter its namespaces: the step, sent to Consort before the child
/// gives up (after `fork` only an errno would cross back).
const STEPS: [&str; 9] = [
    "create its namespaces",
    "map its user and group",
    "bring its loopback up",
    "listen at its branch's address",
    "hand its branch listener to Consort",
    "make its mounts private",
    "mount a devpts instance of its own at /dev/pts",
    "mount its own /dev/shm",
    "mount a dependency directory read-only",
];

/// The step after [`STEPS`]: Landlock applied (then: capabilities dropped).
const STEP_LANDLOCK: usize = STEPS.len();

/// The Landlock rights on the run's own `/dev/pts`: its ptys read, written and configured.
fn pts_access() -> landlock::BitFlags<AccessFs> {
    AccessFs::from_file(ABI::V7) | AccessFs::ReadDir
}

impl Plan {
    /// A plan for this process's user: a network of its own forwarding `branch` (when it is
    /// an address on loopback, or `localhost`), `shm` as `/dev/shm`, `read_only` mounted so.
    pub(crate) fn new(
        branch: Option<(&str, u16)>,
        shm: Option<&Path>,
        read_only: &[PathBuf],
        writable: &[PathBuf],
    ) -> Plan {
        let uid = nix::unistd::geteuid();
        let gid = nix::unistd::getegid();
        let listen = match branch {
            None => Some(Vec::new()),
            Some((host, port)) => loopback_addresses(host, port),
        };
        let mounted = |dirs: &mut dyn Iterator<Item = &PathBuf>| -> Vec<(CString, MsFlags)> {
            dirs.filter_map(|dir| Some((c_path(dir)?, mount_flags(dir)?)))
                .collect()
        };
        let read_only: Vec<PathBuf> = read_only
            .iter()
            .filter_map(|d| d.canonicalize().ok())
            .collect();
        let inside: Vec<PathBuf> = writable
            .iter()
            .filter_map(|w| w.canonicalize().ok())
            .filter(|w| read_only.iter().any(|r| w.starts_with(r) && w != r))
            .collect();
        Plan {
            new_user: !uid.is_root(),
            confined: true,
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            own_network: listen.is_some(),
            branch_listen: listen.unwrap_or_default(),
            shm: shm.and_then(c_path),
            read_only: mounted(&mut read_only.iter()),
            writable_inside: mounted(&mut inside.iter()),
        }
    }

    /// The plan of an unconfined run (`sandbox = "off"`): the machine's network, ptys and
    /// `/dev/shm`, only its dependency directories read-only, so that not even an unconfined
    /// lane writes the main tree's through its links.
    pub(crate) fn unconfined(read_only: &[PathBuf], writable: &[PathBuf]) -> Plan {
        Plan {
            confined: false,
            own_network: false,
            ..Plan::new(None, None, read_only, writable)
        }
    }

    /// Whether the plan changes anything for an unconfined run.
    pub(crate) fn protects_anything(&self) -> bool {
        !self.read_only.is_empty()
    }

    /// Whether runs get a network of their own.
    pub(crate) fn own_network(&self) -> bool {
        self.own_network
    }

    /// What the child does between `fork` and `exec`: its namespaces, its listeners sent on
    /// `channel`, its mounts, then `rules` applied and every capability dropped. Only system
    /// calls on what was prepared before the fork.
    fn enter(
        &self,
        channel: &UnixDatagram,
        rules: Option<RulesetCreated>,
    ) -> std::result::Result<(), (u8, Errno)> {
        let mut flags = CloneFlags::CLONE_NEWNS;
        if self.new_user {
            flags |= CloneFlags::CLONE_NEWUSER;
        }
        if self.own_network {
            flags |= CloneFlags::CLONE_NEWNET;
        }
        unshare(flags).map_err(|e| (0, e))?;
        if self.new_user {
            self.map_user()?;
        }
        if self.own_network {
            loopback_up().map_err(|e| (2, e))?;
            for addr in &self.branch_listen {
                let listener = TcpListener::bind(addr)
                    .map_err(|e| (3, Errno::from_raw(e.raw_os_error().unwrap_or(0))))?;
                send_fd(channel, listener.as_fd()).map_err(|e| (4, e))?;
            }
        }
        let none = None::<&str>;
        mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).map_err(|e| (5, e))?;
        if self.confined {
            self.own_devices()?;
        }
        for (dir, flags) in &self.read_only {
            bind_over(dir, *flags | MsFlags::MS_RDONLY).map_err(|e| (8, e))?;
        }
        for (dir, flags) in &self.writable_inside {
            bind_over(dir, *flags).map_err(|e| (8, e))?;
        }
        if let Some(rules) = rules {
            apply_rules(rules).map_err(|e| (STEP_LANDLOCK as u8, e))?;
        }
        if self.confined {
            super::sandbox::drop_capabilities()
                .map_err(|e| (STEP_LANDLOCK as u8 + 1, errno_of(&e)))?;
        }
        Ok(())
    }

    /// Maps the child's user and group to themselves in its new user namespace.
    fn map_user(&self) -> std::result::Result<(), (u8, Errno)> {
        // Consort is not dumpable, so its `/proc` files (and the child's, inherited) belong to
        // root, and a normal user could not write its own maps. The child alone becomes
        // dumpable: its memory is Consort's copy until exec, which no confined run may read
        // (Landlock refuses it ptrace access to anything outside its domain), and exec sets
        // the flag anew.
        nix::sys::prctl::set_dumpable(true).map_err(|e| (1, e))?;
        write_proc(c"/proc/self/setgroups", b"deny")
            .and_then(|()| write_proc(c"/proc/self/uid_map", &self.uid_map))
            .and_then(|()| write_proc(c"/proc/self/gid_map", &self.gid_map))
            .map_err(|e| (1, e))
    }

    /// A devpts instance of the child's own at `/dev/pts`, and its own `/dev/shm`.
    fn own_devices(&self) -> std::result::Result<(), (u8, Errno)> {
        let none = None::<&str>;
        mount(
            Some("devpts"),
            "/dev/pts",
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0600"),
        )
        .map_err(|e| (6, e))?;
        if let Some(shm) = &self.shm {
            mount(
                Some(shm.as_c_str()),
                "/dev/shm",
                none,
                MsFlags::MS_BIND,
                none,
            )
            .map_err(|e| (7, e))?;
        }
        Ok(())
    }
}

/// Registers `plan` (and then `rules`) to be entered by the child `cmd` starts; the child's
/// listeners, and the step it failed at, come back on the returned channel ([`drain`]).
pub(crate) fn confine(
    cmd: &mut std::process::Command,
    plan: std::sync::Arc<Plan>,
    rules: Option<RulesetCreated>,
) -> std::io::Result<UnixDatagram> {
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = UnixDatagram::pair()?;
    let mut rules = Some(rules);
    let enter = move || -> std::io::Result<()> {
        let rules = rules.take().flatten();
        plan.enter(&theirs, rules).map_err(|(step, errno)| {
            let _ = nix::sys::socket::send(theirs.as_raw_fd(), &[step], MsgFlags::MSG_DONTWAIT);
            std::io::Error::from_raw_os_error(errno as i32)
        })
    };
    // SAFETY: `enter` runs in the child between fork and exec. It makes system calls on what
    // was prepared before the fork (paths, maps, the datagram pair, the Landlock ruleset);
    // the few small allocations on the way (the control-message buffer of `sendmsg`, the
    // capability sets) are safe with glibc's malloc, which fork leaves usable in the child.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(enter);
    }
    Ok(ours)
}

/// What the child sent on `channel`: its branch listeners, in order, and the step it failed
/// at, if it did.
pub(crate) struct Sent {
    /// The listeners at the branch's address in the child's network.
    pub listeners: Vec<TcpListener>,
    /// The step the child failed at.
    failed_at: Option<u8>,
}

impl Sent {
    /// Why `spawn` failed with `error`, as a sentence naming the step.
    pub(crate) fn failure(&self, error: &std::io::Error) -> String {
        let what = match self.failed_at.map(usize::from) {
            Some(n) if n < STEPS.len() => STEPS[n],
            Some(STEP_LANDLOCK) => "apply its Landlock rules",
            Some(_) => "drop its capabilities",
            None => return format!("the run's process could not start: {error}"),
        };
        format!("the run's process could not {what}: {error}")
    }
}

/// Everything waiting on `channel` (the child has exec'd or failed by now).
pub(crate) fn drain(channel: &UnixDatagram) -> Sent {
    let mut sent = Sent {
        listeners: Vec::new(),
        failed_at: None,
    };
    loop {
        let mut byte = [0u8; 1];
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let Ok(msg) = recvmsg::<()>(
            channel.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        ) else {
            return sent;
        };
        let mut fds = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = c {
                    fds.extend(received);
                }
            }
        }
        if fds.is_empty() && msg.bytes == 1 {
            sent.failed_at = Some(byte[0]);
        }
        for fd in fds {
            // SAFETY: the descriptor was just received over SCM_RIGHTS: a new number in this
            // process that nothing else owns.
            #[allow(unsafe_code)]
            let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            sent.listeners.push(TcpListener::from(fd));
        }
    }
}

/// The run may bind `host` itself in its network: an address on loopback (each of
/// `localhost`'s). Anything else stays outside the namespace.
fn loopback_addresses(host: &str, port: u16) -> Option<Vec<SocketAddr>> {
    if host == "localhost" {
        return Some(vec![
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
        ]);
    }
    let ip: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    ip.is_loopback().then(|| vec![SocketAddr::new(ip, port)])
}

fn c_path(path: &Path) -> Option<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).ok()
}

/// The flags of the mount `dir` is on that a bind of it must keep.
fn mount_flags(dir: &Path) -> Option<MsFlags> {
    use nix::sys::statvfs::{FsFlags, statvfs};
    let st = statvfs(dir).ok()?;
    let mut flags = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if st.flags().contains(fs) {
            flags |= ms;
        }
    }
    Some(flags)
}

/// Binds `dir` over itself, then gives that mount `flags` (read-only, or writable again for a
/// directory inside a read-only one).
fn bind_over(dir: &CString, flags: MsFlags) -> nix::Result<()> {
    let none = None::<&str>;
    mount(
        Some(dir.as_c_str()),
        dir.as_c_str(),
        none,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        none,
    )?;
    mount(
        none,
        dir.as_c_str(),
        none,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags,
        none,
    )
}

fn write_proc(path: &std::ffi::CStr, data: &[u8]) -> nix::Result<()> {
    let fd = open(path, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    let written = nix::unistd::write(&fd, data)?;
    if written == data.len() {
        Ok(())
    } else {
        Err(Errno::EIO)
    }
}

/// Brings the namespace's loopback (interface 1 in every new network namespace) up, by one
/// route-netlink request: `RTM_NEWLINK` with `IFF_UP`, answered by an acknowledgement.
fn loopback_up() -> nix::Result<()> {
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST_ACK: u16 = 0x1 | 0x4;
    const IFF_UP: u32 = 1;
    const LOOPBACK_INDEX: i32 = 1;
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    let mut msg = [0u8; 32];
    msg[0..4].copy_from_slice(&32u32.to_ne_bytes());
    msg[4..6].copy_from_slice(&RTM_NEWLINK.to_ne_bytes());
    msg[6..8].copy_from_slice(&NLM_F_REQUEST_ACK.to_ne_bytes());
    msg[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // ifinfomsg: family 0, pad, type 0, then the index, the flags and what changes.
    msg[20..24].copy_from_slice(&LOOPBACK_INDEX.to_ne_bytes());
    msg[24..28].copy_from_slice(&IFF_UP.to_ne_bytes());
    msg[28..32].copy_from_slice(&IFF_UP.to_ne_bytes());
    sendto(
        sock.as_raw_fd(),
        &msg,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut ack = [0u8; 64];
    let n = nix::sys::socket::recv(sock.as_raw_fd(), &mut ack, MsgFlags::empty())?;
    // NLMSG_ERROR (2) carries the request's error: 0 is success.
    if n < 20 || u16::from_ne_bytes([ack[4], ack[5]]) != 2 {
        return Err(Errno::EPROTO);
    }
    match i32::from_ne_bytes([ack[16], ack[17], ack[18], ack[19]]) {
        0 => Ok(()),
        e => Err(Errno::from_raw(-e)),
    }
}

fn send_fd(channel: &UnixDatagram, fd: std::os::fd::BorrowedFd<'_>) -> nix::Result<()> {
    let fds = [fd.as_raw_fd()];
    sendmsg::<()>(
        channel.as_raw_fd(),
        &[std::io::IoSlice::new(b"L")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map(drop)
}

/// Adds the rule for the run's own `/dev/pts` (it exists only now) and applies `rules`.
fn apply_rules(rules: RulesetCreated) -> nix::Result<()> {
    let pts = open(
        c"/dev/pts",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let to_errno = |_: RulesetError| Errno::EPERM;
    let status = rules
        .add_rule(PathBeneath::new(pts, pts_access()))
        .map_err(to_errno)?
        .restrict_self()
        .map_err(to_errno)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(Errno::ENOSYS);
    }
    Ok(())
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(Errno::EPERM as i32))
}

/// Whether this process can give runs namespaces of their own: a real child (`true`) enters
/// them all, a network and a devpts instance included, without Landlock.
pub(crate) fn probe() -> Result<(), String> {
    let plan = std::sync::Arc::new(Plan::new(Some(("127.0.0.1", 5432)), None, &[], &[]));
    let mut cmd = std::process::Command::new("true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let channel = confine(&mut cmd, plan, None).map_err(|e| e.to_string())?;
    let spawned = cmd.spawn();
    let sent = drain(&channel);
    match spawned {
        Ok(mut child) => {
            let _ = child.wait();
            match sent.listeners.len() {
                1 => Ok(()),
                n => Err(format!("the probe's process sent {n} listeners, not 1")),
            }
        }
        Err(e) => Err(sent.failure(&e)),
    }
}
