//! Keys: scoped by namespace and version with a collision-free encoding.

use bytes::Bytes;

/// A record key.
///
/// Built from a name and optional namespace and version:
///
/// ```
/// use idem_client::Key;
/// let k = Key::new("order-1234").namespace("tenant-a").version("2");
/// assert_eq!(&k.to_bytes()[..], b"tenant-a:2:order-1234");
/// // Separators inside a part are escaped, so parts never run together.
/// let tricky = Key::new("b").namespace("a:x");
/// assert_eq!(&tricky.to_bytes()[..], b"a\\:x::b");
/// assert_ne!(tricky.to_bytes(), Key::new("x:b").namespace("a").to_bytes());
/// ```
///
/// # Format
///
/// `namespace:version:name`, where each part has `\` written as `\\` and
/// `:` as `\:`, and a missing part is empty. Every part is escaped, so two
/// different (namespace, version, name) triples never encode to the same
/// bytes. A key made with [`Key::raw`] (or from a `&str`, `String` or
/// `Bytes`) is sent exactly as given.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    repr: Repr,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Repr {
    Raw(Bytes),
    Scoped {
        namespace: Option<String>,
        version: Option<String>,
        name: String,
    },
}

fn escape(part: &str, out: &mut Vec<u8>) {
    for b in part.bytes() {
        if b == b'\\' || b == b':' {
            out.push(b'\\');
        }
        out.push(b);
    }
}

impl Key {
    /// A scoped key named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Key {
            repr: Repr::Scoped {
                namespace: None,
                version: None,
                name: name.into(),
            },
        }
    }

    /// A key sent exactly as given.
    pub fn raw(bytes: impl Into<Bytes>) -> Self {
        Key {
            repr: Repr::Raw(bytes.into()),
        }
    }

    /// Sets the namespace (e.g. the tenant).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        if let Repr::Scoped { namespace, .. } = &mut self.repr {
            *namespace = Some(ns.into());
        }
        self
    }

    /// Sets the operation version (change it when semantics change).
    pub fn version(mut self, v: impl Into<String>) -> Self {
        if let Repr::Scoped { version, .. } = &mut self.repr {
            *version = Some(v.into());
        }
        self
    }

    /// The bytes sent to the server.
    pub fn to_bytes(&self) -> Bytes {
        match &self.repr {
            Repr::Raw(b) => b.clone(),
            Repr::Scoped {
                namespace,
                version,
                name,
            } => {
                let mut out = Vec::with_capacity(name.len() + 16);
                escape(namespace.as_deref().unwrap_or(""), &mut out);
                out.push(b':');
                escape(version.as_deref().unwrap_or(""), &mut out);
                out.push(b':');
                escape(name, &mut out);
                Bytes::from(out)
            }
        }
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::raw(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::raw(Bytes::from(s))
    }
}

impl From<Bytes> for Key {
    fn from(b: Bytes) -> Self {
        Key::raw(b)
    }
}

impl From<&Key> for Key {
    fn from(k: &Key) -> Self {
        k.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_collision_free() {
        let parts = ["", "a", ":", "\\", "a:b", "a\\", "\\:", "::"];
        let mut seen = std::collections::HashMap::new();
        for ns in parts {
            for v in parts {
                for n in parts {
                    let k = Key::new(n).namespace(ns).version(v).to_bytes();
                    if let Some(prev) = seen.insert(k.clone(), (ns, v, n)) {
                        panic!("{prev:?} and {:?} both encode to {k:?}", (ns, v, n));
                    }
                }
            }
        }
    }

    #[test]
    fn raw_keys_are_unchanged() {
        assert_eq!(&Key::from("a:b").to_bytes()[..], b"a:b");
        assert_eq!(&Key::new("x").to_bytes()[..], b"::x");
    }
}
