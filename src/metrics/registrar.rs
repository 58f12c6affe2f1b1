//! Registering series on one recorder, with their help text.

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::PrometheusRecorder;

/// Registers series on one recorder, with their help text.
pub(super) struct Registrar<'a> {
    pub(super) recorder: &'a PrometheusRecorder,
}

const META: Metadata<'static> = Metadata::new("tandem", Level::INFO, Some(module_path!()));

impl Registrar<'_> {
    fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
        let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, *v)).collect();
        Key::from_parts(name, labels)
    }

    pub(super) fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> Counter {
        self.recorder
            .describe_counter(KeyName::from_const_str(name), None, help.into());
        let c = self
            .recorder
            .register_counter(&Self::key(name, labels), &META);
        // Exported at zero from the start, not from its first count.
        c.increment(0);
        c
    }

    pub(super) fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> Gauge {
        self.recorder
            .describe_gauge(KeyName::from_const_str(name), None, help.into());
        let g = self
            .recorder
            .register_gauge(&Self::key(name, labels), &META);
        g.set(0.0);
        g
    }

    pub(super) fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        labels: &[(&'static str, &'static str)],
    ) -> Histogram {
        self.recorder
            .describe_histogram(KeyName::from_const_str(name), unit, help.into());
        self.recorder
            .register_histogram(&Self::key(name, labels), &META)
    }
}
