//! index.html opened in headless Chromium: the screenshot is not blank (several distinct
//! colours, enough non-background pixels, every config's colour present) and the DOM holds
//! the inline SVG charts. Chromium is installed by scripts/setup-chromium when missing; if
//! that fails the test fails, saying so.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The chromium binary, installing it first when missing.
fn chromium() -> PathBuf {
    let find = || -> Option<PathBuf> {
        ["chromium", "chromium-browser"].iter().find_map(|name| {
            let out =
                Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().ok()?;
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
        })
    };
    if let Some(p) = find() {
        return p;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup-chromium");
    let status = Command::new(&script).status();
    match (status, find()) {
        (Ok(s), Some(p)) if s.success() => p,
        (status, _) => panic!(
            "chromium is missing and {} could not install it ({status:?}); install Debian's `chromium` package \
             (apt-get install -y chromium) and re-run",
            script.display()
        ),
    }
}

/// Runs chromium headless with `args` on `url`; kills it after two minutes. Returns (stdout,
/// stderr); they go through files, not pipes, so a large DOM cannot fill a pipe and stall it.
fn headless(chromium: &Path, args: &[String], url: &str) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let (out_path, err_path) =
        (profile.path().join("stdout.txt"), profile.path().join("stderr.txt"));
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().join("profile").display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("start chromium");
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    (read(&out_path), read(&err_path))
}

/// RGB pixels of a PNG.
fn decode_png(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let bytes = &buf[..info.buffer_size()];
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected PNG colour type {other:?}"),
    };
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let px = bytes.chunks_exact(channels).map(|c| [c[0], c[1], c[2]]).collect();
    (info.width, info.height, px)
}

#[test]
fn the_report_renders_in_headless_chromium() {
    let chromium = chromium();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ortbench(
        &[&["run", "--models", "tiny-bert,tiny-gpt2", "--out", out.to_str().unwrap()], QUICK]
            .concat(),
        &[],
        false,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let index = out.join("index.html").canonicalize().unwrap();
    let url = format!("file://{}", index.display());

    let shot = dir.path().join("shot.png");
    let (_, err) = headless(&chromium, &[format!("--screenshot={}", shot.display())], &url);
    assert!(shot.is_file(), "no screenshot: {err}");
    let (w, h, px) = decode_png(&shot);
    assert_eq!((w, h), (1280, 2000));
    // The background is the most common colour; the rest is content.
    let mut counts = std::collections::HashMap::<[u8; 3], usize>::new();
    for p in &px {
        *counts.entry(*p).or_default() += 1;
    }
    let (&bg, &bg_count) = counts.iter().max_by_key(|(_, n)| **n).unwrap();
    let content = 1.0 - bg_count as f64 / px.len() as f64;
    assert!(
        content > 0.05,
        "only {:.1}% of the page differs from the background {bg:?}",
        content * 100.0
    );
    let distinct = counts.iter().filter(|(_, n)| **n >= 20).count();
    assert!(distinct >= 16, "only {distinct} distinct colours: a blank page?");
    // Every config's bar colour (charts::config_color) is on screen.
    for (config, rgb) in [
        ("pytorch", [0xEE, 0x4C, 0x2C]),
        ("ort", [0x1F, 0x77, 0xB4]),
        ("ort-zero1", [0x2C, 0xA0, 0x2C]),
    ] {
        let near = px
            .iter()
            .filter(|p| p.iter().zip(rgb).all(|(a, b)| (*a as i32 - b).abs() <= 6))
            .count();
        assert!(near >= 200, "{config}'s colour {rgb:?} covers only {near} pixels");
    }

    // The DOM as Chromium parsed it holds every chart as inline SVG.
    let (dom, _) = headless(&chromium, &["--dump-dom".to_string()], &url);
    assert!(dom.contains("ortbench report"), "DOM: {}", &dom[..dom.len().min(400)]);
    let charts = 3 + 2 * 2;
    assert_eq!(dom.matches("<svg").count(), charts, "inline SVG charts in the DOM");
    assert!(dom.matches("<rect").count() > 10, "bars are SVG rects");
}
