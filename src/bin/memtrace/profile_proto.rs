//! The messages of pprof's `profile.proto` (github.com/google/pprof, `proto/profile.proto`),
//! declared by hand for prost so that no build script or `protoc` is needed.
//!
//! Field numbers and types follow the upstream file; string fields are indexes into
//! [`Profile::string_table`], whose first entry is always the empty string.

/// A whole profile.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// The kind and unit of each value of every sample.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Binaries the addresses belong to.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Locations referred to by samples.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions referred to by locations.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile; index 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Regexp (string index) of frames to drop.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Regexp (string index) of frames to keep.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// When the profile was collected (ns since the Unix epoch).
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// How long the profile covers, in ns.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// The kind of events between sampled occurrences.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// The number of events between sampled occurrences.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string indexes).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The type of the preferred sample value (string index).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    /// Documentation link (string index).
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

/// A value's kind and unit (string indexes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// E.g. `alloc_space`.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// E.g. `bytes`.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// Values recorded at one stack.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Location ids, leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Extra labels.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A sample label.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// Key (string index).
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String value (string index).
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// Unit of `num` (string index).
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A mapped binary.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Start address.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End address.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// Offset in the file.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// Path of the binary (string index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Build id (string index).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Locations already carry function names.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Locations already carry file names.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Locations already carry line numbers.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Locations already carry inlined frames.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// A program location with its (possibly inlined) source lines.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The mapping it belongs to (0 for none).
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Instruction address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Source lines, innermost (inlined) first; the last is the caller they were inlined into.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Whether frames were folded.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// A source line of a function.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// The function's id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Line number.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Column number.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// A function.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Name (string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Mangled name (string index).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Source file (string index).
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// First line of the function.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
