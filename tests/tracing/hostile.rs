//! Programs that do what a traced program may do untraced and that a tracer could get in the
//! way of (issue #39), each in a child process that must end as it does untraced, with its
//! trace readable: a setuid program run by another user, a program that waits for signals on
//! a thread, closes every descriptor, writes to a vanishing reader or past its file size
//! limit, allocates on small foreign stacks, exits from a signal handler, loads a library with
//! corrupt unwind tables, or forbids opening files.

use crate::skip::skip;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use memtrace_rs::trace_if_requested;

use super::{assert_one_message, child_at, output_within, site_freed, Trace};

/// The roles of this module's children.
pub(crate) fn child_role(role: &str) {
    match role {
        "hostile:secure" => {
            let guard = trace_if_requested();
            site_freed();
            drop(guard);
        }
        "hostile:sigwait" | "hostile:signalfd" => take_sigterm_on_a_thread(role == "hostile:signalfd"),
        "hostile:sigpipe" => {
            // SAFETY: restores the default action, as a program may (std ignores SIGPIPE).
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            write_until_the_writer_fails("Broken pipe");
        }
        "hostile:fsize" => write_until_the_writer_fails("File too large"),
        "hostile:fsize-at-start" => {
            let guard = trace_if_requested();
            assert!(!memtrace_rs::currently_tracing());
            site_freed();
            drop(guard);
            eprintln!("went on untraced");
        }
        "hostile:close-all" => close_every_descriptor_then_open_data_files(),
        "hostile:exit-in-handler" => exit_from_a_signal_handler(),
        "hostile:coroutine" => allocate_on_a_small_coroutine_stack(),
        "hostile:free-on-coroutine" => free_sampled_blocks_on_a_coroutine_stack(),
        "hostile:altstack" => allocate_in_a_handler_on_a_small_alternate_stack(),
        "hostile:corrupt-eh-frame" => call_libraries_with_corrupt_unwind_tables(),
        "hostile:seccomp" | "hostile:seccomp-all-threads" => {
            forbid_opening_files_then_allocate(role == "hostile:seccomp-all-threads")
        }
        other => panic!("unknown role {other}"),
    }
}

/// Install a seccomp filter that kills the process at any attempt to open a file (`open`,
/// `openat`, `openat2`, `creat`), on this thread or, with `all_threads`, on every thread of
/// the process (the tracer's too).
fn forbid_opening_files(all_threads: bool) {
    // Classic BPF over `struct seccomp_data` (the system call's number at offset 0).
    const LOAD_NR: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JUMP_IF_EQUAL: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RETURN: u16 = 0x06; // BPF_RET | BPF_K
    const KILL_PROCESS: u32 = 0x8000_0000;
    const ALLOW: u32 = 0x7fff_0000;
    let forbidden = [libc::SYS_open, libc::SYS_openat, libc::SYS_openat2, libc::SYS_creat];
    let mut filter = vec![libc::sock_filter { code: LOAD_NR, jt: 0, jf: 0, k: 0 }];
    for (i, nr) in forbidden.iter().enumerate() {
        // Equal: jump to the kill, after the remaining tests and the allow.
        let to_kill = (forbidden.len() - i) as u8;
        filter.push(libc::sock_filter { code: JUMP_IF_EQUAL, jt: to_kill, jf: 0, k: *nr as u32 });
    }
    filter.push(libc::sock_filter { code: RETURN, jt: 0, jf: 0, k: ALLOW });
    filter.push(libc::sock_filter { code: RETURN, jt: 0, jf: 0, k: KILL_PROCESS });
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_mut_ptr() };
    let flags: libc::c_ulong = if all_threads { 1 } else { 0 }; // SECCOMP_FILTER_FLAG_TSYNC
                                                                // SAFETY: a valid filter program, read by the kernel during the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let installed = libc::syscall(libc::SYS_seccomp, 1 /* SECCOMP_SET_MODE_FILTER */, flags, &program);
        assert_eq!(installed, 0, "{}", std::io::Error::last_os_error());
    }
}

/// As a sandboxed program: tracing started, then a filter that kills the process on opening
/// any file, then allocations at sites and on threads the tracer has not seen, and the stop.
fn forbid_opening_files_then_allocate(all_threads: bool) {
    // Loaded before, first sampled after.
    let (_, calls) = load_calling_library(&std::env::var(LIBRARIES_VAR).unwrap());
    let guard = trace_if_requested();
    // Nothing sampled before the filter (a thread's name is looked up at its first sample), but
    // time for the writer to get ready, as it does while tracing starts.
    std::thread::sleep(Duration::from_millis(200));
    // glibc reads `/proc/sys/vm/overcommit_memory` the first time an arena other than the main
    // one shrinks: a sandboxed program must have that done before (untraced, it dies of it).
    let blocks: Vec<Vec<u8>> = (0..4).map(|_| std::hint::black_box(Vec::with_capacity(120 << 10))).collect();
    drop(blocks);
    forbid_opening_files(all_threads);
    for _ in 0..100 {
        assert_eq!(std::hint::black_box(calls(allocate)), 21);
    }
    let kept = super::site_kept();
    std::thread::spawn(super::site_grown).join().unwrap();
    // Long enough for the writer's polls and flushes, and for its arena's trimming.
    for _ in 0..15 {
        site_freed();
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(kept);
    if let Some(guard) = guard {
        guard.finish().expect("the trace written");
    }
    eprintln!("done without opening a file");
}

/// Environment variable: the libraries a `hostile:corrupt-eh-frame` child loads, separated by
/// colons.
const LIBRARIES_VAR: &str = "MEMTRACE_TEST_LIBRARIES";
/// The function each of those libraries exports: it calls the function it is given.
const CALLS: &str = "hostile_calls";

/// Allocations made through a frame of each library in [`LIBRARIES_VAR`]: every one sampled,
/// its stack walked through the library's frame, whose unwind tables are corrupt. The
/// libraries stay loaded, each at an address of its own: one loaded where the last one was
/// could be walked with the rules cached from the last one's tables, not its own.
fn call_libraries_with_corrupt_unwind_tables() {
    let guard = trace_if_requested();
    for (i, library) in std::env::var(LIBRARIES_VAR).unwrap().split(':').enumerate() {
        let (_, calls) = load_calling_library(library);
        assert_eq!(std::hint::black_box(calls(allocate)), 21);
        eprintln!("called library {i}");
    }
    drop(guard);
}

/// The function a library of [`build_calling_library`]'s calls with.
type Calls = extern "C" fn(extern "C" fn() -> i32) -> i32;

/// Allocate a few blocks through a library's frame.
extern "C" fn allocate() -> i32 {
    let blocks: Vec<Vec<u8>> = (0..20).map(|i| std::hint::black_box(vec![i as u8; 100])).collect();
    blocks.len() as i32
}

/// Load the library `path` (built by [`build_calling_library`]): its handle and its function.
fn load_calling_library(path: &str) -> (*mut libc::c_void, Calls) {
    let (library, symbol) = (std::ffi::CString::new(path).unwrap(), std::ffi::CString::new(CALLS).unwrap());
    // SAFETY: NUL-terminated strings; the library has no constructors, and its function has the
    // type it is called with.
    unsafe {
        let handle = libc::dlopen(library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!handle.is_null(), "{path}");
        let calls = libc::dlsym(handle, symbol.as_ptr());
        assert!(!calls.is_null());
        (handle, std::mem::transmute::<*mut libc::c_void, Calls>(calls))
    }
}

/// Memory for a stack, with an inaccessible page below it: a stack that overflows faults
/// (SIGSEGV) rather than overwrite what lies below.
struct GuardedStack {
    mapping: *mut libc::c_void,
    size: usize,
}

/// The guard page's size (the largest page size the stack's systems use).
const GUARD: usize = 64 << 10;

impl GuardedStack {
    fn new(size: usize) -> GuardedStack {
        // SAFETY: a new private mapping of our own, its lowest page made inaccessible.
        unsafe {
            let mapping = libc::mmap(
                std::ptr::null_mut(),
                GUARD + size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(mapping, libc::MAP_FAILED);
            assert_eq!(libc::mprotect(mapping, GUARD, libc::PROT_NONE), 0);
            GuardedStack { mapping, size }
        }
    }

    /// The stack's lowest address.
    fn low(&self) -> usize {
        self.mapping as usize + GUARD
    }

    fn memory(&mut self) -> &mut [u8] {
        // SAFETY: the accessible part of the mapping, ours while `self` lives.
        unsafe { std::slice::from_raw_parts_mut(self.low() as *mut u8, self.size) }
    }
}

impl Drop for GuardedStack {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer in use.
        unsafe { libc::munmap(self.mapping, GUARD + self.size) };
    }
}

/// Environment variable: the stack a `hostile:coroutine` child leaves when it allocates, in
/// bytes.
const STACK_LEFT_VAR: &str = "MEMTRACE_TEST_STACK_LEFT";

/// The stack a `hostile:coroutine` child leaves when it allocates untraced and traced: under
/// 2 KiB, optimised. Unoptimised, the system allocator's frames take more, and the
/// allocator's frame before the stack check some 2.5 KiB more than those: as in `faults.rs`,
/// the untraced run gets 1.25 KiB and the traced run 3 KiB more.
const COROUTINE_STACK_LEFT: [usize; 2] = if cfg!(debug_assertions) { [1280, 4352] } else { [1536, 1536] };

/// Say what a trace's guard, if any, found: the samples dropped for want of stack.
fn finish_counting_stack_drops(guard: Option<memtrace_rs::TraceGuard>) {
    if let Some(guard) = guard {
        let stats = guard.finish().expect("the trace written");
        eprintln!("dropped for want of stack: {}", stats.dropped_no_stack);
    }
}

/// As a coroutine library: an allocation on a 64 KiB stack switched to with `swapcontext`,
/// with under 2 KiB of it left.
fn allocate_on_a_small_coroutine_stack() {
    let left: usize = std::env::var(STACK_LEFT_VAR).unwrap().parse().unwrap();
    let guard = trace_if_requested();
    let mut stack = GuardedStack::new(64 << 10);
    let low = stack.low();
    let allocated =
        super::on_stack(stack.memory(), move || super::faults::descend_and_allocate(left, low, Box::new([1u8; 64])));
    assert_ne!(allocated, 0);
    let deepest = super::faults::STACK_LEFT_DEEPEST.load(std::sync::atomic::Ordering::Relaxed);
    assert!(deepest <= left + 256, "{deepest} bytes left");
    finish_counting_stack_drops(guard);
}

/// Blocks a `hostile:free-on-coroutine` child allocates on its own stack and frees on a
/// coroutine's.
const FREED_ON_COROUTINE: usize = 1000;

#[inline(never)]
fn site_freed_on_coroutine() -> Box<[u8; 64]> {
    Box::new(std::hint::black_box([7u8; 64]))
}

/// As a program with green threads: blocks allocated on the thread's own stack, every one
/// sampled, then freed on a coroutine's (of a size the tracer does not know).
fn free_sampled_blocks_on_a_coroutine_stack() {
    let guard = trace_if_requested().expect("tracing");
    let blocks: Vec<Box<[u8; 64]>> = (0..FREED_ON_COROUTINE).map(|_| site_freed_on_coroutine()).collect();
    let mut stack = GuardedStack::new(256 << 10);
    super::on_stack(stack.memory(), move || drop(blocks));
    let stats = guard.finish().expect("the trace written");
    eprintln!("frees lost: {} for want of stack, {} in all", stats.frees_lost_no_stack, stats.frees_lost);
}

/// The size of the alternate signal stack of a `hostile:altstack` child untraced and traced
/// (in [`STACK_LEFT_VAR`]): 4 KiB, optimised, which leaves the handler a few hundred bytes
/// where the kernel writes 3.5 KiB of registers (with AVX-512). Unoptimised, the allocator's
/// frame before the stack check takes more (see `COROUTINE_STACK_LEFT`): the traced run gets 4 KiB more,
/// still less than any capture needs.
const ALTERNATE_STACK_SIZE: [usize; 2] = if cfg!(debug_assertions) { [4096, 8192] } else { [4096, 4096] };

/// Signals a handler on a 4 KiB alternate stack took.
static HANDLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The signals a `hostile:altstack` child sends itself.
const SIGNALS: usize = 10;

/// A signal handler on a 4 KiB alternate stack that allocates.
fn allocate_in_a_handler_on_a_small_alternate_stack() {
    extern "C" fn allocate(_: libc::c_int) {
        drop(std::hint::black_box(Box::new([5u8; 48])));
        HANDLED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let size: usize = std::env::var(STACK_LEFT_VAR).unwrap().parse().unwrap();
    let guard = trace_if_requested();
    let mut stack = GuardedStack::new(size);
    // SAFETY: the alternate stack is live until disabled below; the handler lives as long as
    // the process.
    unsafe {
        let memory = stack.memory();
        let alternate = libc::stack_t { ss_sp: memory.as_mut_ptr().cast(), ss_flags: 0, ss_size: memory.len() };
        assert_eq!(libc::sigaltstack(&alternate, std::ptr::null_mut()), 0);
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = allocate as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_ONSTACK;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()), 0);
        for _ in 0..SIGNALS {
            libc::raise(libc::SIGUSR1);
        }
        let disabled = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
        assert_eq!(libc::sigaltstack(&disabled, std::ptr::null_mut()), 0);
    }
    assert_eq!(HANDLED.load(std::sync::atomic::Ordering::Relaxed), SIGNALS);
    finish_counting_stack_drops(guard);
}

/// As a program whose SIGTERM handler calls `exit`, which runs the exit hook, on a thread the
/// signal interrupted while it allocates (inside `malloc`, with its arena locked, often),
/// its trace's guard never dropped.
fn exit_from_a_signal_handler() {
    extern "C" fn exit_now(_: libc::c_int) {
        // SAFETY: what the program does, not async-signal-safe: the point of the test.
        unsafe { libc::exit(0) };
    }
    std::mem::forget(trace_if_requested().expect("tracing"));
    // SAFETY: a handler that lives as long as the process; the signal is sent to this thread.
    unsafe {
        libc::signal(libc::SIGTERM, exit_now as *const () as libc::sighandler_t);
        let this = libc::pthread_self() as usize;
        // Some milliseconds in, different in each run.
        let delay = Duration::from_micros(5_000 + u64::from(std::process::id() % 64) * 500);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            libc::pthread_kill(this as libc::pthread_t, libc::SIGTERM);
        });
    }
    loop {
        site_freed();
    }
}

/// Environment variable: the directory a `hostile:close-all` child writes its data files in.
const DATA_DIR_VAR: &str = "MEMTRACE_TEST_DATA_DIR";
/// The data files a `hostile:close-all` child writes: the last one on the number the trace's
/// descriptor had.
const DATA_FILES: usize = 4;

/// The contents of data file `i`.
fn data(i: usize) -> String {
    format!("the program's own data, file {i}\n")
}

/// As a daemon that closes every descriptor from 3 up once started (tracing then), and opens
/// and writes its data files, one of them on the number the trace had, while it allocates on.
fn close_every_descriptor_then_open_data_files() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let dir = PathBuf::from(std::env::var_os(DATA_DIR_VAR).unwrap());
    let trace = PathBuf::from(std::env::var_os("MEMTRACE_FILE").unwrap());
    let trace = std::fs::canonicalize(trace.parent().unwrap()).unwrap().join(trace.file_name().unwrap());
    let guard = trace_if_requested().expect("tracing");
    site_freed();
    // A periodic flush: the trace then holds samples.
    std::thread::sleep(Duration::from_millis(1200));
    let trace_fd = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            (std::fs::read_link(entry.path()).ok()? == trace)
                .then(|| entry.file_name().to_str()?.parse::<i32>().ok())?
        })
        .next()
        .expect("the trace's descriptor");
    // SAFETY: closes descriptors, as a daemon does; nothing of this program's uses them after.
    assert_eq!(unsafe { libc::syscall(libc::SYS_close_range, 3, u32::MAX, 0) }, 0);
    let mut files: Vec<std::fs::File> =
        (0..DATA_FILES).map(|i| std::fs::File::create(dir.join(i.to_string())).unwrap()).collect();
    let last = files.last().unwrap().as_raw_fd();
    // SAFETY: descriptors of this program's own.
    assert_eq!(unsafe { libc::dup2(last, trace_fd) }, trace_fd);
    // The file on the trace's number alone (the `File` replaced closes its first one).
    // SAFETY: the descriptor is this program's own from now on, and only this `File` closes it.
    *files.last_mut().unwrap() = unsafe { std::os::fd::FromRawFd::from_raw_fd(trace_fd) };
    let end = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < end {
        site_freed();
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, file) in files.iter_mut().enumerate() {
        file.write_all(data(i).as_bytes()).unwrap();
    }
    let stopped = guard.finish();
    eprintln!("stopped: {stopped:?}");
}

/// A set of the one signal `signal`.
fn signal_set(signal: libc::c_int) -> libc::sigset_t {
    // SAFETY: a set initialised by sigemptyset before it is added to.
    unsafe {
        let mut set = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        set
    }
}

/// As a program that shuts down gracefully on SIGTERM, waited for on a thread of its own with
/// `sigwait` (or read from a `signalfd`), every thread of its own blocking it. The parent
/// starts it with SIGTERM blocked (libtest's threads too); it is let through on this thread
/// while tracing starts, as a program that blocks it after `trace_if_requested` does. A
/// SIGTERM sent to the process meanwhile stays pending until the waiting thread takes it,
/// unless a thread not blocking it (a tracer thread) takes it first, and dies of it.
fn take_sigterm_on_a_thread(signalfd: bool) {
    let term = signal_set(libc::SIGTERM);
    // SAFETY: changes this thread's mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &term, std::ptr::null_mut()) };
    let guard = trace_if_requested().expect("tracing");
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &term, std::ptr::null_mut()) };
    site_freed();
    // SAFETY: a signal to this process, which blocks it on every thread of its own.
    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    // Time for a thread not blocking it to take it.
    std::thread::sleep(Duration::from_millis(200));
    let waiter = std::thread::spawn(move || {
        // SAFETY: waits for a signal this thread blocks (inherited), with a set initialised
        // above; the signalfd is read into a buffer of its size, then closed.
        unsafe {
            if signalfd {
                let fd = libc::signalfd(-1, &term, libc::SFD_CLOEXEC);
                assert!(fd >= 0);
                let mut info: libc::signalfd_siginfo = std::mem::zeroed();
                let size = std::mem::size_of::<libc::signalfd_siginfo>();
                assert_eq!(libc::read(fd, (&raw mut info).cast(), size), size as isize);
                libc::close(fd);
                info.ssi_signo as libc::c_int
            } else {
                let mut signal = 0;
                assert_eq!(libc::sigwait(&term, &mut signal), 0);
                signal
            }
        }
    });
    assert_eq!(waiter.join().unwrap(), libc::SIGTERM);
    site_freed();
    guard.finish().expect("the trace written");
    eprintln!("shut down gracefully");
}

/// Sample every allocation until the writer stops on a write error naming `error` (a reader
/// gone, the file size limit): the program itself goes on.
fn write_until_the_writer_fails(error: &str) {
    let path = std::env::var("MEMTRACE_FILE").unwrap();
    let config = memtrace_rs::TraceConfig::new(path).rate(1.0);
    let guard = memtrace_rs::start_tracing(config).expect("tracing");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while memtrace_rs::currently_tracing() {
        assert!(std::time::Instant::now() < deadline, "the writer never failed");
        site_freed();
    }
    let e = guard.finish().expect_err("a write error");
    assert!(e.to_string().contains(error), "{e}");
    site_freed();
    eprintln!("went on after the writer stopped");
}

/// The user the setuid test runs its program as.
const NOBODY: u32 = 65534;

/// A directory under `/tmp` that every user may enter (mode 0755, root's), removed when
/// dropped: where a program another user runs is put.
struct OpenDir(PathBuf);

impl OpenDir {
    fn new(name: &str) -> OpenDir {
        let dir = PathBuf::from(format!("/tmp/memtrace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        OpenDir(dir)
    }
}

impl Drop for OpenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run a copy of this test binary, `program`, as `nobody` in role `hostile:secure` with `env`:
/// its output.
fn run_as_nobody(program: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = child_at(program, "hostile:secure", env);
    cmd.uid(NOBODY).gid(NOBODY).current_dir("/");
    output_within(cmd, "hostile:secure", Duration::from_secs(60)).0
}

/// A setuid-root program run by `nobody` ignores `MEMTRACE_FILE` and `MEMTRACE`: it neither
/// creates a new file in root's directory nor touches root's existing file; the same program
/// without the setuid bit traces for its user.
#[test]
fn a_setuid_program_ignores_the_tracing_variables() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: cannot make a setuid-root program, nothing tested");
        return;
    }
    let dir = OpenDir::new("setuid");
    let program = dir.0.join("traced");
    std::fs::copy(std::env::current_exe().unwrap(), &program).unwrap();
    std::os::unix::fs::chown(&program, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Root's: nobody may write neither the directory nor the file.
    let roots = dir.0.join("root");
    std::fs::create_dir(&roots).unwrap();
    let (new, existing) = (roots.join("new.ctf"), roots.join("existing"));
    let contents = b"root's own data\n";
    std::fs::write(&existing, contents).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
    let modified = std::fs::metadata(&existing).unwrap().mtime_nsec();
    for var in ["MEMTRACE_FILE", "MEMTRACE"] {
        for target in [&new, &existing] {
            let out = run_as_nobody(&program, &[(var, target.to_str().unwrap()), ("MEMTRACE_RATE", "1")]);
            assert!(out.status.success(), "{var}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(!new.exists(), "{var} created root's file");
            let metadata = std::fs::metadata(&existing).unwrap();
            assert_eq!(std::fs::read(&existing).unwrap(), contents, "{var} wrote root's file");
            assert_eq!((metadata.uid(), metadata.mode() & 0o7777, metadata.mtime_nsec()), (0, 0o644, modified));
            assert_one_message(&out, &format!("{var} is ignored"));
        }
    }
    // Without the setuid bit, the same program traces into a file of nobody's.
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = dir.0.join("nobody");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    let trace = theirs.join("trace.ctf");
    let out = run_as_nobody(&program, &[("MEMTRACE_FILE", trace.to_str().unwrap())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(&trace).unwrap().uid(), NOBODY);
    assert!(!Trace::read(&trace).allocs.is_empty());
}

/// Run `role` tracing into `path` (rate 1 for the roles that set it themselves), `before_exec`
/// run in the child before it starts: it must end successfully with `said` on stderr, within
/// a minute.
fn run_hostile(
    role: &str,
    path: &Path,
    before_exec: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) -> std::process::Output {
    let mut cmd = super::child(role, &[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "0.01")]);
    // SAFETY: `before_exec` makes only async-signal-safe calls.
    unsafe { cmd.pre_exec(before_exec) };
    let (out, _) = output_within(cmd, role, Duration::from_secs(60));
    assert!(out.status.success(), "{role}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

/// Block SIGTERM on the calling thread (the child's only one, before it runs the program).
fn block_sigterm() -> std::io::Result<()> {
    let term = signal_set(libc::SIGTERM);
    // SAFETY: changes the calling thread's mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &term, std::ptr::null_mut()) };
    Ok(())
}

/// A SIGTERM sent to a program that takes it on a thread of its own (`sigwait`, `signalfd`),
/// every other thread of its blocking it, is the program's: the tracer's threads never take
/// it, and the program shuts down as it would untraced.
#[test]
fn sigterm_waited_for_on_a_thread_is_the_programs() {
    for role in ["hostile:sigwait", "hostile:signalfd"] {
        let path = super::temp_path(role.trim_start_matches("hostile:"));
        let out = run_hostile(role, &path, block_sigterm);
        assert!(String::from_utf8_lossy(&out.stderr).contains("shut down gracefully"));
        assert!(super::memtrace_messages(&out).is_empty());
        assert!(!Trace::read(&path).allocs.is_empty());
        let _ = std::fs::remove_file(&path);
    }
}

/// The trace file's size limit (`ulimit -f 512`) reached: the writer's write fails (no
/// SIGXFSZ, whose default action ends the process) and tracing stops with one message; the
/// program goes on, and the trace is readable up to the limit.
#[test]
fn the_file_size_limit_stops_the_trace_not_the_program() {
    const LIMIT: u64 = 512 << 10;
    let path = super::temp_path("fsize");
    let out = run_hostile("hostile:fsize", &path, || {
        let limit = libc::rlimit { rlim_cur: LIMIT, rlim_max: libc::RLIM_INFINITY };
        // SAFETY: a valid limit.
        unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) };
        Ok(())
    });
    assert_one_message(&out, "File too large");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), LIMIT);
    assert!(!Trace::read(&path).allocs.is_empty());
    let _ = std::fs::remove_file(&path);
}

/// A file size limit of 0: the trace's first write, made on the program's thread as tracing
/// starts, fails (no SIGXFSZ there either); the start fails with one message, leaves no file,
/// and the program runs on untraced.
#[test]
fn a_file_size_limit_of_zero_fails_the_start_not_the_program() {
    let path = super::temp_path("fsize-at-start");
    let out = run_hostile("hostile:fsize-at-start", &path, || {
        let limit = libc::rlimit { rlim_cur: 0, rlim_max: libc::RLIM_INFINITY };
        // SAFETY: a valid limit.
        unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) };
        Ok(())
    });
    assert_one_message(&out, "File too large");
    assert!(String::from_utf8_lossy(&out.stderr).contains("went on untraced"));
    assert!(!path.exists(), "the failed start left its file");
}

/// A program that restores SIGPIPE's default action, tracing into a FIFO whose reader goes
/// away: the writer's write fails (no SIGPIPE, which would end the process) and tracing stops
/// with one message; the program goes on, and what the reader read is a readable trace.
#[test]
fn a_reader_gone_stops_the_trace_not_the_program() {
    use std::io::Read;
    let path = super::temp_path("sigpipe");
    let mut reader = super::fifo_reader(&path);
    let mut cmd = super::child("hostile:sigpipe", &[("MEMTRACE_FILE", path.to_str().unwrap())]);
    let reading = std::thread::spawn(move || {
        // The start of the trace, then the reader goes. (A FIFO no process has open for
        // writing reads as ended: until the child opens it.)
        let mut read = vec![0; 256 << 10];
        let (mut filled, deadline) = (0, std::time::Instant::now() + Duration::from_secs(60));
        while filled < read.len() && std::time::Instant::now() < deadline {
            match reader.read(&mut read[filled..]).unwrap() {
                0 => std::thread::sleep(Duration::from_millis(10)),
                n => filled += n,
            }
        }
        read.truncate(filled);
        read
    });
    cmd.stdin(std::process::Stdio::null());
    let (out, _) = output_within(cmd, "hostile:sigpipe", Duration::from_secs(60));
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_one_message(&out, "Broken pipe");
    let read = reading.join().unwrap();
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, read).unwrap();
    assert!(!Trace::read(&path).allocs.is_empty());
    let _ = std::fs::remove_file(&path);
}

/// A program that closes every descriptor from 3 up while tracing, then opens its data files,
/// one on the number the trace's descriptor had: the trace stops with one message, and the
/// data files hold the program's data alone.
#[test]
fn a_program_that_closes_every_descriptor_keeps_its_files_to_itself() {
    let path = super::temp_path("close-all");
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("MEMTRACE_FILE", path.to_str().unwrap()),
        ("MEMTRACE_RATE", "0.01"),
        (DATA_DIR_VAR, dir.path().to_str().unwrap()),
    ];
    let (out, _) = output_within(super::child("hostile:close-all", &env), "hostile:close-all", Duration::from_secs(60));
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    for i in 0..DATA_FILES {
        assert_eq!(std::fs::read_to_string(dir.path().join(i.to_string())).unwrap(), data(i), "data file {i}");
    }
    assert_one_message(&out, "closed the trace's descriptor");
    assert!(!Trace::read(&path).allocs.is_empty());
    let _ = std::fs::remove_file(&path);
}

/// `exit` called by a SIGTERM handler that interrupted the program's allocation: the exit hook
/// ends in bounded time, without allocating (the interrupted `malloc` may hold its arena's
/// lock), in each of 50 runs, and leaves a readable trace.
#[test]
fn exit_from_a_signal_handler_never_deadlocks() {
    const RUNS: usize = 50;
    const AT_ONCE: usize = 5;
    for batch in 0..RUNS / AT_ONCE {
        let runs: Vec<_> = (0..AT_ONCE)
            .map(|i| {
                let path = super::temp_path(&format!("exit-in-handler-{batch}-{i}"));
                let env = [("MEMTRACE_FILE", path.to_str().unwrap().to_owned()), ("MEMTRACE_RATE", "0.01".into())];
                std::thread::spawn(move || {
                    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let cmd = super::child("hostile:exit-in-handler", &env);
                    // The stop timeout (1 s) is the most the exit hook waits for a stuck writer.
                    let (out, took) = output_within(cmd, "hostile:exit-in-handler", Duration::from_secs(15));
                    (path, out, took)
                })
            })
            .collect();
        for run in runs {
            let (path, out, took) = run.join().unwrap();
            assert!(out.status.success(), "{:?} after {took:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
            Trace::read(&path);
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Allocations on stacks of a size the tracer does not know, every one sampled: on a
/// coroutine's stack with under 2 KiB left, and in a signal handler on a 4 KiB alternate
/// stack. Each runs as it does untraced, its samples dropped and counted (no stack to take
/// them on), never overflowing the stack.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn small_foreign_stacks_are_never_overflowed() {
    for (role, [untraced_left, traced_left]) in
        [("hostile:coroutine", COROUTINE_STACK_LEFT), ("hostile:altstack", ALTERNATE_STACK_SIZE)]
    {
        let [untraced_left, traced_left] = [untraced_left, traced_left].map(|left| left.to_string());
        let env = [(STACK_LEFT_VAR, untraced_left.as_str())];
        let (untraced, _) = output_within(super::child(role, &env), role, Duration::from_secs(60));
        assert!(untraced.status.success(), "{role} untraced: {:?}", untraced.status);
        let path = super::temp_path(role.trim_start_matches("hostile:"));
        let env =
            [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1"), (STACK_LEFT_VAR, traced_left.as_str())];
        let (out, _) = output_within(super::child(role, &env), role, Duration::from_secs(60));
        assert!(out.status.success(), "{role}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let dropped: u64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("dropped for want of stack: "))
            .expect("the stack drops said")
            .parse()
            .unwrap();
        assert!(dropped >= 1, "{role}: {dropped}");
        Trace::read(&path);
        let _ = std::fs::remove_file(&path);
    }
}

/// Frees of sampled blocks made on a coroutine's stack, where there is no knowing how much
/// stack a message to the writer may take: none is lost, and the trace shows every block freed.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn frees_on_a_coroutine_stack_are_not_lost() {
    let path = super::temp_path("free-on-coroutine");
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1")];
    let role = "hostile:free-on-coroutine";
    let (out, _) = output_within(super::child(role, &env), role, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(stderr.contains("frees lost: 0 for want of stack, 0 in all"), "{stderr}");
    let trace = Trace::read(&path);
    let blocks: Vec<_> = trace.at_site("site_freed_on_coroutine").collect();
    assert_eq!(blocks.len(), FREED_ON_COROUTINE);
    let live = blocks.iter().filter(|(id, _)| !trace.collected.contains(id)).count();
    assert_eq!(live, 0, "{live} blocks freed on the coroutine's stack left live in the trace");
    let _ = std::fs::remove_file(&path);
}

/// Where the unwind tables of `symbol` lie in the ELF object `image` (whose `.eh_frame` GCC
/// writes: a `zR` CIE, FDEs with 4-byte pc-relative addresses and no augmentation data), as
/// file offsets.
struct Tables {
    /// The function's FDE, and its call-frame instructions.
    fde: usize,
    instructions: std::ops::Range<usize>,
    /// The FDE's CIE.
    cie: usize,
    /// `.eh_frame_hdr`, its number of table entries, and the function's entry in its table.
    hdr: usize,
    entries: usize,
    entry: usize,
}

fn tables(image: &[u8], symbol: &str) -> Tables {
    use object::{Object, ObjectSection, ObjectSymbol};
    let file = object::File::parse(image).unwrap();
    let function = file.dynamic_symbols().find(|s| s.name() == Ok(symbol)).expect("the symbol").address();
    let word = |at: usize| u32::from_le_bytes(image[at..at + 4].try_into().unwrap());
    let section = |name: &str| {
        let section = file.section_by_name(name).unwrap_or_else(|| panic!("no {name}"));
        (section.file_range().unwrap().0 as usize, section.address())
    };
    let (hdr, hdr_address) = section(".eh_frame_hdr");
    // Version 1; `.eh_frame` pointer pc-relative sdata4, count udata4, table datarel sdata4.
    assert_eq!(image[hdr..hdr + 4], [1, 0x1b, 0x03, 0x3b], "an unusual .eh_frame_hdr");
    let entries = word(hdr + 8) as usize;
    let entry = (0..entries)
        .map(|i| hdr + 12 + 8 * i)
        .find(|&at| hdr_address.wrapping_add_signed(word(at) as i32 as i64) == function)
        .expect("the function in the search table");
    let (eh_frame, eh_frame_address) = section(".eh_frame");
    let fde = eh_frame + (hdr_address.wrapping_add_signed(word(entry + 4) as i32 as i64) - eh_frame_address) as usize;
    let pc_begin = (eh_frame_address + (fde - eh_frame) as u64 + 8).wrapping_add_signed(word(fde + 8) as i32 as i64);
    assert_eq!(pc_begin, function);
    // Length, CIE pointer, address, size, augmentation data length (0).
    assert_eq!(image[fde + 16], 0, "augmentation data");
    let cie = fde + 4 - word(fde + 4) as usize;
    assert_eq!(image[cie + 8..cie + 12], [1, b'z', b'R', 0], "a zR CIE");
    Tables { fde, instructions: fde + 17..fde + 4 + word(fde) as usize, cie, hdr, entries, entry }
}

/// A small C library in `dir` whose function [`CALLS`] calls the function it is given (no
/// frame pointer); `None` without a C compiler.
fn build_calling_library(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("calls.c");
    let code =
        format!("__attribute__((noinline)) int {CALLS}(int (*f)(void)) {{\n  int r = f();\n  return r + 1;\n}}\n");
    std::fs::write(&source, code).unwrap();
    let built = dir.join("libcalls.so");
    let compiled = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-fomit-frame-pointer", "-o"])
        .arg(&built)
        .arg(&source)
        .status()
        .ok()?;
    assert!(compiled.success());
    Some(built)
}

/// Corruptions of the headers of [`CALLS`]'s unwind tables in a library: (what, where,
/// the bytes written there). Each is one that a lookup trusting the tables follows into
/// memory it must not read (or into an `abort` on an encoding it does not know), or that
/// would make it use an FDE that does not cover the function.
fn header_corruptions(image: &[u8], t: &Tables) -> Vec<(&'static str, usize, Vec<u8>)> {
    let le = |value: u32| value.to_le_bytes().to_vec();
    let word = |at: usize| u32::from_le_bytes(image[at..at + 4].try_into().unwrap());
    // The CIE's augmentation string ("zR") is at +9; then a byte each: code and data
    // alignment, return address register, augmentation data length, and its `R` encoding.
    let (cie_augmentation, return_address, cie_encoding) = (t.cie + 9, t.cie + 14, t.cie + 16);
    assert_eq!(image[return_address..cie_encoding + 1], [16, 1, 0x1b], "return address in r16, encoding pcrel sdata4");
    // The function's entry in the search table and the one before or after it, to swap.
    assert!(t.entries >= 2, "a search table of {} entries", t.entries);
    let first = if t.entry > t.hdr + 12 { t.entry - 8 } else { t.entry };
    vec![
        ("FDE length past every segment", t.fde, le(0x7fff_fff0)),
        ("FDE length announcing 64-bit DWARF", t.fde, le(u32::MAX)),
        ("FDE length cutting its addresses short", t.fde, le(6)),
        ("CIE pointer 2 GiB before the FDE", t.fde + 4, le(0x7fff_fff0)),
        ("CIE pointer 4 GiB before the FDE", t.fde + 4, le(0xffff_fff0)),
        ("CIE pointer to the FDE itself", t.fde + 4, le(4)),
        ("CIE pointer zero (the FDE reads as a CIE)", t.fde + 4, le(0)),
        ("FDE address far from the function", t.fde + 8, le(0x4000_0000)),
        ("FDE range empty", t.fde + 12, le(0)),
        ("FDE range past the address space", t.fde + 12, le(u32::MAX)),
        ("CIE length past every segment", t.cie, le(0x7fff_fff0)),
        ("CIE length announcing 64-bit DWARF", t.cie, le(u32::MAX)),
        ("CIE length cutting its augmentation short", t.cie, le(7)),
        ("CIE id not zero", t.cie + 4, le(7)),
        ("augmentation string without its NUL", cie_augmentation, vec![b'z'; 7]),
        ("augmentation letter unknown", cie_augmentation + 1, vec![b'Q']),
        ("augmentation string without z", cie_augmentation, vec![b'R', 0]),
        ("augmentation data past the CIE", cie_encoding - 1, vec![0x7f]),
        ("return address in an unknown register", return_address, vec![0x7f]),
        ("pointer encoding of no format", cie_encoding, vec![0x0f]),
        ("pointer encoding indirect", cie_encoding, vec![0x9b]),
        ("pointer encoding aligned", cie_encoding, vec![0x50]),
        ("pointer encoding omitted", cie_encoding, vec![0xff]),
        ("pointer encoding absolute 8 bytes", cie_encoding, vec![0x04]),
        (".eh_frame_hdr version 2", t.hdr, vec![2]),
        (".eh_frame pointer encoding of no format", t.hdr + 1, vec![0x0f]),
        (".eh_frame pointer far outside", t.hdr + 4, le(0x7fff_fff0)),
        ("FDE count encoding of no format", t.hdr + 2, vec![0x0e]),
        ("FDE count encoding omitted", t.hdr + 2, vec![0xff]),
        ("table encoding of no format", t.hdr + 3, vec![0x3f]),
        ("table encoding pc-relative", t.hdr + 3, vec![0x1b]),
        ("FDE count past every segment", t.hdr + 8, le(0x0fff_ffff)),
        ("FDE count zero", t.hdr + 8, le(0)),
        ("table entry's FDE far outside", t.entry + 4, le(0x7fff_fff0)),
        ("table entry's FDE before the object", t.entry + 4, le(0x8000_0000)),
        ("table entry's FDE inside the FDE", t.entry + 4, le(word(t.entry + 4) + 2)),
        ("table entry's address out of order", t.entry, le(0x7fff_0000)),
        ("table entries swapped", first, [&image[first + 8..first + 16], &image[first..first + 8]].concat()),
    ]
}

/// Copies of a small C library whose function [`CALLS`] has corrupt unwind tables, in `dir`:
/// each of the [`header_corruptions`], then call-frame instructions no parser knows, a CFA
/// far off the stack, a CFA below the stack pointer, the CFA in `rbp` (which this code does
/// not set up), rules the cached walk does not follow, then `fuzzed` copies of the
/// instructions with one to three random bytes changed (a fixed seed). `None` without a C
/// compiler.
fn build_corrupt_libraries(dir: &Path, fuzzed: usize) -> Option<Vec<(String, PathBuf)>> {
    let image = std::fs::read(build_calling_library(dir)?).unwrap();
    let tables = tables(&image, CALLS);
    let instructions = tables.instructions.clone();
    let length = instructions.len();
    let filled = |bytes: &[u8]| -> Vec<u8> { bytes.iter().copied().chain(std::iter::repeat(0)).take(length).collect() };
    let mut variants: Vec<(String, usize, Vec<u8>)> =
        header_corruptions(&image, &tables).into_iter().map(|(what, at, bytes)| (what.to_owned(), at, bytes)).collect();
    for (what, bytes) in [
        ("instructions unknown", vec![0x3f; length]),
        ("CFA far off the stack", filled(&[0x0e, 0xff, 0xff, 0xff, 0x7f])),
        ("CFA below the stack pointer", filled(&[0x0e, 0x00])),
        ("CFA in rbp", filled(&[0x0c, 0x06, 0x10])),
        // Well formed, but beyond what the cached walk follows: a walker that trusted them
        // would read address 0.
        ("CFA in r10", filled(&[0x0c, 0x0a, 0x10])),
        ("CFA by an expression reading address 0", filled(&[0x0f, 0x02, 0x30, 0x06])),
        ("rbp saved by an expression reading address 0", filled(&[0x10, 0x06, 0x03, 0x13, 0x30, 0x06])),
    ] {
        variants.push((what.to_owned(), instructions.start, bytes));
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    for i in 0..fuzzed {
        let mut bytes = image[instructions.clone()].to_vec();
        for _ in 0..1 + random() % 3 {
            let at = random() % length;
            bytes[at] = random() as u8;
        }
        variants.push((format!("instructions fuzzed ({i})"), instructions.start, bytes));
    }
    let libraries = variants
        .into_iter()
        .enumerate()
        .map(|(i, (what, at, bytes))| {
            let mut corrupt = image.clone();
            corrupt[at..at + bytes.len()].copy_from_slice(&bytes);
            let path = dir.join(format!("libcorrupt{i}.so"));
            std::fs::write(&path, corrupt).unwrap();
            (what, path)
        })
        .collect();
    Some(libraries)
}

/// Allocations sampled through the frame of a library whose unwind tables are corrupt (the
/// headers of its `.eh_frame_hdr`, CIE or FDE, or its function's call-frame instructions, set
/// or fuzzed), with each unwinder: the program runs as it does untraced, and the trace is
/// readable; the stack ends at that frame where the tables cannot be followed.
#[test]
fn corrupt_unwind_tables_in_a_library_never_crash_the_walk() {
    const FUZZED: usize = 60;
    let dir = tempfile::tempdir().unwrap();
    let Some(libraries) = build_corrupt_libraries(dir.path(), FUZZED) else {
        skip("no C compiler (apt-get install gcc)");
        return;
    };
    let paths = libraries.iter().map(|(_, p)| p.to_str().unwrap()).collect::<Vec<_>>().join(":");
    let run = |env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.push((LIBRARIES_VAR, &paths));
        output_within(
            super::child("hostile:corrupt-eh-frame", &env),
            "hostile:corrupt-eh-frame",
            Duration::from_secs(120),
        )
        .0
    };
    assert!(run(&[]).status.success(), "untraced");
    let path = super::temp_path("corrupt-eh-frame");
    for unwinder in ["dwarf", "frame-pointers", ""] {
        let out =
            run(&[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1"), ("MEMTRACE_UNWINDER", unwinder)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let called = stderr.lines().filter(|l| l.starts_with("called library")).count();
        let what = libraries.get(called).map_or("", |(what, _)| what.as_str());
        assert!(out.status.success(), "unwinder {unwinder:?}: {:?} at library {called}: {what}", out.status);
        assert!(!Trace::read(&path).allocs.is_empty());
    }
    let _ = std::fs::remove_file(&path);
}

/// A program that forbids opening files once tracing has started (a seccomp filter that kills
/// the process, on its own thread or on every thread): the tracer opens nothing after its
/// start, and the program runs as it does untraced, its trace readable.
#[test]
fn a_sandbox_that_kills_on_open_installed_after_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let Some(library) = build_calling_library(dir.path()) else {
        skip("no C compiler (apt-get install gcc)");
        return;
    };
    let library = library.to_str().unwrap();
    for role in ["hostile:seccomp", "hostile:seccomp-all-threads"] {
        let untraced = super::child(role, &[(LIBRARIES_VAR, library)]);
        let (untraced, _) = output_within(untraced, role, Duration::from_secs(60));
        assert!(untraced.status.success(), "{role} untraced: {:?}", untraced.status);
        let path = super::temp_path(role.trim_start_matches("hostile:"));
        let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "0.001"), (LIBRARIES_VAR, library)];
        let (out, _) = output_within(super::child(role, &env), role, Duration::from_secs(60));
        assert!(out.status.success(), "{role}: {:?}", out.status);
        let trace = Trace::read(&path);
        assert!(trace.at_site("::site_kept").count() > 0);
        let _ = std::fs::remove_file(&path);
    }
}
