use super::*;

// The demo under a real `log` logger: the process-wide logger it installs captures the lines
// that the tests read back.
mod real_logger;

#[test]
fn run_on_the_cpu_backend_emits_what_was_asked() {
    use specula::cpu::CpuVerifier;
    let cfg = DemoConfig {
        max_tokens: Some(40),
        duration: None,
        log_interval: Duration::from_millis(200),
        ..DemoConfig::default()
    };
    let verifier = CpuVerifier::<MAX_K>::new(1).unwrap();
    let readback = verifier.readback();
    let summary = run(
        &cfg,
        CORPUS,
        verifier,
        readback,
        &mut std::io::sink(),
        &mut |_| {},
    )
    .unwrap();
    assert!(summary.totals.emitted_tokens >= 40);
}

#[test]
fn run_tree_counts_every_tree_as_a_draft() {
    let cfg = DemoConfig {
        tree: Some("2x3".parse().unwrap()),
        max_tokens: Some(40),
        duration: None,
        ..DemoConfig::default()
    };
    let verifier = Backend::<MAX_K>::open(&"cpu:1".parse().unwrap()).unwrap();
    let readback = verifier.readback().unwrap();
    let summary = run_tree(
        &cfg,
        CORPUS,
        verifier,
        readback,
        &mut std::io::sink(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(summary.totals.tree_drafts, summary.totals.drafts);
    assert_eq!(
        summary.totals.tree_draft_tokens,
        14 * summary.totals.tree_drafts
    );
}

#[test]
fn check_refuses_every_bad_setting_without_a_corpus() {
    assert!(DemoConfig::default().check().is_ok());
    let bad = [
        DemoConfig {
            k: 0,
            ..DemoConfig::default()
        },
        DemoConfig {
            batch: 4097,
            ..DemoConfig::default()
        },
        DemoConfig {
            max_tokens: None,
            duration: None,
            ..DemoConfig::default()
        },
        DemoConfig {
            log_interval: Duration::from_micros(999),
            ..DemoConfig::default()
        },
        DemoConfig {
            target_order: usize::MAX,
            ..DemoConfig::default()
        },
        DemoConfig {
            draft_order: 0,
            ..DemoConfig::default()
        },
        DemoConfig {
            labels: vec![("job".into(), "x".into())],
            ..DemoConfig::default()
        },
        DemoConfig {
            sampling: Sampling {
                filter: Filter::NONE.with_top_p(0.0),
                ..Sampling::default()
            },
            ..DemoConfig::default()
        },
        DemoConfig {
            tree: Some(TreeShape { width: 1, depth: 9 }),
            ..DemoConfig::default()
        },
        DemoConfig {
            tree: Some(TreeShape {
                width: 1,
                depth: usize::MAX,
            }),
            ..DemoConfig::default()
        },
        DemoConfig {
            tree: Some(TreeShape { width: 2, depth: 2 }),
            method: Method::Typical,
            ..DemoConfig::default()
        },
    ];
    for cfg in bad {
        assert!(cfg.check().is_err(), "{cfg:?}");
    }
}

/// A summary of a run at `k` with `emitted` tokens over one CPU second, and at `k = MAX_K`
/// counters and timings the advice reads: acceptance 0.6 at every position, a draft token
/// costing 0.2 plain steps.
fn summary(k: usize, emitted: u64) -> DemoSummary {
    let mut totals = Counters::ZERO;
    let mut costs = CostMeter::ZERO;
    // 1000 steps whose accepted lengths follow P(a ≥ j) = 0.6^j closely enough.
    let mut left = 1000.0f64;
    for a in 0..=k {
        let n = if a == k { left } else { (left * 0.4).round() };
        for _ in 0..n as u64 {
            totals.record(k, a).unwrap();
            costs.record(&StepTiming {
                draft_len: k,
                fixed_ns: 10_000,
                scaled_ns: 2_000 * k as u64,
                ..StepTiming::default()
            });
        }
        left -= n;
    }
    totals.emitted_tokens = emitted;
    DemoSummary {
        totals,
        elapsed: Duration::from_secs(2),
        steps: 0,
        sample: String::new(),
        metrics_addr: None,
        stopped_by: None,
        costs,
        tree: None,
        finished: FinishedRequests::ZERO,
        cpu: Some(Duration::from_secs(1)),
    }
}

#[test]
fn the_sweep_predicts_from_the_calibration_run_and_judges_the_advice() {
    let cfg = DemoConfig::default();
    let mut ks = Vec::new();
    // Measured throughput peaks at k = 3 (1000), the advised k = 2 is within 5 % (960).
    let measured = [900, 960, 1000, 900, 850, 800, 750, 700];
    let report = sweep_k(&cfg, 2, |c| {
        ks.push(c.k);
        Ok(summary(c.k, measured[c.k - 1]))
    })
    .unwrap();
    // The calibration run first, then rounds over every k.
    let mut want = vec![MAX_K];
    for _ in 0..2 {
        want.extend(1..=MAX_K);
    }
    assert_eq!(ks, want);
    let advice = summary(MAX_K, 700).advice().unwrap();
    assert_eq!(report.recommended, advice.recommended());
    assert_eq!(report.recommended, 2, "{advice:?}");
    assert!((report.cost.per_draft() - 0.2).abs() < 1e-12);
    assert_eq!(report.calibration, 700.0);
    assert!(report.cpu_time);
    assert_eq!(report.rows.len(), MAX_K);
    let s8 = advice.expected_speedup(MAX_K).unwrap();
    for (r, m) in report.rows.iter().zip(measured) {
        assert_eq!(r.measured, [m as f64, m as f64]);
        assert_eq!(r.median, m as f64);
        assert_eq!(Some(r.predicted_speedup), advice.expected_speedup(r.k));
        assert_eq!(Some(r.predicted_tokens), advice.expected_tokens(r.k));
        assert!((r.predicted - 700.0 * r.predicted_speedup / s8).abs() < 1e-9);
        assert!((r.tokens_per_step - m as f64 / 1000.0).abs() < 1e-12);
    }
    assert_eq!(report.best_measured(), 3);
    assert!((report.ratio() - 0.96).abs() < 1e-12);
    assert!(report.passed());
    let text = report.to_string();
    assert!(
        text.contains("calibration run at k=8: 700 tokens/s (CPU)"),
        "{text}"
    );
    assert!(
        text.ends_with("SWEEP recommended=2 best=3 ratio=0.9600 pass=true"),
        "{text}"
    );
    // The advised k 10 % below the best: a failure.
    let low = [900, 900, 1000, 900, 850, 800, 750, 700];
    let report = sweep_k(&cfg, 1, |c| Ok(summary(c.k, low[c.k - 1]))).unwrap();
    assert!(!report.passed());
    assert!(report.to_string().contains("within 5 %: FAIL"));
}

#[test]
fn the_sweep_refuses_trees_no_rounds_and_stops_when_asked() {
    let tree = DemoConfig {
        tree: Some("2x3".parse().unwrap()),
        ..DemoConfig::default()
    };
    let never = |_: &DemoConfig| -> Result<DemoSummary, DemoError> { unreachable!() };
    assert!(matches!(
        sweep_k(&tree, 1, never),
        Err(DemoError::Config(_))
    ));
    for rounds in [0, MAX_SWEEP_ROUNDS + 1] {
        assert!(matches!(
            sweep_k(&DemoConfig::default(), rounds, never),
            Err(DemoError::Config(_))
        ));
    }
    // A calibration run without timings gives no advice.
    let mut untimed = summary(MAX_K, 1);
    untimed.costs = CostMeter::ZERO;
    let r = sweep_k(&DemoConfig::default(), 1, |_| Ok(untimed.clone()));
    assert!(matches!(r, Err(DemoError::Config(m)) if m.contains("no advice")));
    // A stop request ends the series after the run in progress.
    let cfg = DemoConfig::default();
    let mut runs = 0;
    let r = sweep_k(&cfg, 3, |c| {
        runs += 1;
        if runs == 2 {
            cfg.shutdown.request(Reason::Output);
        }
        Ok(summary(c.k, 10))
    });
    assert!(
        matches!(r, Err(DemoError::Stopped(Reason::Output))),
        "{r:?}"
    );
    assert_eq!(runs, 2);
    // Wall time where no CPU time is known.
    let mut wall = summary(1, 300);
    wall.cpu = None;
    assert_eq!(sweep_throughput(&wall), 150.0);
    assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    assert_eq!(median(&[]), 0.0);
}

#[test]
fn the_lines_scripts_parse() {
    let s = summary(MAX_K, 700);
    let a = s.advice().unwrap();
    let line = advice_line(&a, &s.costs.cost_model().unwrap());
    assert!(
        line.starts_with(
            "ADVICE recommended=2 cost_ratio=0.200000 rejection_saving=0.000000000 \
                 speedup=1.333333,1.400000,"
        ),
        "{line}"
    );
    assert_eq!(line.matches(',').count(), 2 * (MAX_K - 1), "{line}");
    let mut f = FinishedRequests::ZERO;
    let mut r = RequestAcceptance::NEW;
    r.record(4, 1).unwrap();
    f.record(&r, &Extremes::default());
    f.record(&RequestAcceptance::NEW, &Extremes::default());
    assert_eq!(
        requests_line(&f),
        "REQUESTS finished=2 drafted=1 rate_sum_micros=250000 low=0 high=0"
    );
    let text = s.to_string();
    assert!(text.contains("advice:                  k=2"), "{text}");
    assert!(text.contains("draft cost ratio:        0.2000"), "{text}");
    assert!(
        text.contains("acceptance lengths:      0:400 1:240"),
        "{text}"
    );
}
