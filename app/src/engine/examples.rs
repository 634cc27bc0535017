//! The real snapshots built into the app (recorded on H200s, ../shared/traces), so the
//! first screen already tells a story. Each opens at its capacity as recorded (inferred
//! from the recording, as `allocsim replay` does); the memory cap its program set, which
//! the snapshot does not record, is kept here from its `.stats.json` and offered beside it.

/// GiB, for caps given as PyTorch's `memory_fraction × total_memory` in GiB.
fn gib(g: f64) -> u64 {
    (g * f64::from(1u32 << 30)).round() as u64
}

/// One built-in snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Example {
    /// File name, as if opened from disk.
    pub file: &'static str,
    /// What it shows, for the menu.
    pub about: &'static str,
    pub bytes: &'static [u8],
    /// The per-process memory cap the program ran under (`None`: the whole GPU), from the
    /// recording's `.stats.json`: offered in the memory-cap menu ("set by the program").
    pub cap_gib: Option<f64>,
    /// Configurations compared on opening (besides the snapshot's own settings).
    pub compare_with: &'static [&'static str],
}

impl Example {
    /// The cap in bytes (`round(fraction × total)` as PyTorch computes it).
    #[must_use]
    pub fn cap_bytes(&self) -> Option<u64> {
        self.cap_gib.map(gib)
    }
}

/// The example the app opens on.
pub const OOM_STORY: Example = Example {
    file: "oom_story.pickle.gz",
    about: "CUDA out of memory with 1.1 GiB free: a cached 2 GiB block carved into 180 MiB tensors, every other one freed, then a 400 MiB request under a 2.2 GiB cap",
    bytes: include_bytes!("../../assets/oom_story.pickle.gz"),
    cap_gib: Some(2.2),
    compare_with: &["pytorch@expandable_segments:True"],
};

/// Every built-in example, the default first.
pub const EXAMPLES: &[Example] = &[
    OOM_STORY,
    Example {
        file: "oom_story_expand.pickle.gz",
        about: "the same requests recorded with expandable_segments:True: the free pages are unmapped and the request fits",
        bytes: include_bytes!("../../assets/oom_story_expand.pickle.gz"),
        cap_gib: Some(2.2),
        compare_with: &["pytorch@expandable_segments:False"],
    },
    Example {
        file: "oom_fragmented.pickle.gz",
        about: "mid-size tensors sharing 20 MiB segments under a 2 GiB cap; a 500 MiB request succeeds only after the cache flush",
        bytes: include_bytes!("../../assets/oom_fragmented.pickle.gz"),
        cap_gib: Some(2.0),
        compare_with: &["pytorch@expandable_segments:True"],
    },
    Example {
        file: "gc_threshold_s2.pickle.gz",
        about: "garbage_collection_threshold:0.6 under a 3 GiB cap, ending in a real OOM",
        bytes: include_bytes!("../../assets/gc_threshold_s2.pickle.gz"),
        cap_gib: Some(3.0),
        compare_with: &["pytorch@expandable_segments:True"],
    },
    Example {
        file: "kvcache_decode.pickle.gz",
        about: "greedy decode with a naively growing KV cache (torch.cat every step), 233 k events with stack frames",
        bytes: include_bytes!("../../assets/kvcache_decode.pickle.gz"),
        cap_gib: None,
        compare_with: &["pytorch@expandable_segments:True"],
    },
    Example {
        file: "mlp_train.pickle.gz",
        about: "a small MLP training, stack frames recorded",
        bytes: include_bytes!("../../assets/mlp_train.pickle.gz"),
        cap_gib: None,
        compare_with: &["pytorch@expandable_segments:True"],
    },
    Example {
        file: "resnet_bs_change.pickle.gz",
        about: "ResNet-18 training with a different batch size every step",
        bytes: include_bytes!("../../assets/resnet_bs_change.pickle.gz"),
        cap_gib: None,
        compare_with: &["pytorch@expandable_segments:True"],
    },
    Example {
        file: "multistream_pub.pickle.gz",
        about: "two streams and record_stream: frees that wait for another stream",
        bytes: include_bytes!("../../assets/multistream_pub.pickle.gz"),
        cap_gib: None,
        compare_with: &["pytorch@expandable_segments:True"],
    },
    Example {
        file: "cuda_graph_train.pickle.gz",
        about: "whole-step CUDA graph capture and replay: a private pool, three streams",
        bytes: include_bytes!("../../assets/cuda_graph_train.pickle.gz"),
        cap_gib: None,
        compare_with: &["pytorch@expandable_segments:True"],
    },
    Example {
        file: "wrapped_history_pub.pickle.gz",
        about: "max_entries=20000: the ring buffer wrapped, the trace starts mid-program",
        bytes: include_bytes!("../../assets/wrapped_history_pub.pickle.gz"),
        cap_gib: None,
        compare_with: &["pytorch@expandable_segments:True"],
    },
];

/// The example named `file`, if built in.
#[must_use]
pub fn by_file(file: &str) -> Option<&'static Example> {
    EXAMPLES.iter().find(|e| e.file == file)
}
