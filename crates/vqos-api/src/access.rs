//! Who may use a socket vqosd creates: an owner and a group (each a name or a number) and the
//! permission bits. A vhost-user port in the server role takes them (`socket_owner`,
//! `socket_group`, `socket_mode`) so that a QEMU running as another user, libvirt's
//! `libvirt-qemu`, can connect.
//!
//! ## Behavior
//! - [`Account`] reads a JSON or TOML number as an id, and a string as a name unless it is all
//!   digits (then an id, as `chown` reads it); it is written back the way it was given. Names
//!   are looked up on the daemon's host when the port is added (by `vqosd`, not here).
//! - [`FileMode`] reads a string of octal digits (`"0660"`, `"660"` or `"0o660"`) up to `0777`;
//!   a number is refused, since `660` in JSON would be decimal. It is written as `"0660"`.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A user or a group: by number, or by name (looked up on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Account {
    /// A uid or gid, used as is.
    Id(u32),
    /// A user or group name.
    Name(String),
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Account::Id(id) => write!(f, "{id}"),
            Account::Name(name) => f.write_str(name),
        }
    }
}

impl std::str::FromStr for Account {
    type Err = String;

    fn from_str(s: &str) -> Result<Account, String> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(Account::Id)
                .map_err(|_| format!("Id {s} is out of range"));
        }
        // What useradd and groupadd accept, loosely: no separators, no blanks, no NUL.
        if s.is_empty()
            || s.len() > 64
            || s.contains(|c: char| c.is_whitespace() || ":/,\0".contains(c))
        {
            return Err(format!("Invalid user or group name '{s}'"));
        }
        Ok(Account::Name(s.to_string()))
    }
}

impl Serialize for Account {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Account::Id(id) => s.serialize_u32(*id),
            Account::Name(name) => s.serialize_str(name),
        }
    }
}

impl<'de> Deserialize<'de> for Account {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Account, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Account;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a user or group name, or a number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Account, E> {
                u32::try_from(v)
                    .map(Account::Id)
                    .map_err(|_| E::custom(format!("id {v} is out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Account, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("id {v} is out of range")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Account, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Permission bits of a file, `0` to `0o777`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode(pub u32);

impl std::fmt::Display for FileMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl std::str::FromStr for FileMode {
    type Err = String;

    fn from_str(s: &str) -> Result<FileMode, String> {
        let digits = s.strip_prefix("0o").unwrap_or(s);
        match u32::from_str_radix(digits, 8) {
            Ok(m) if m <= 0o777 && !digits.is_empty() && !digits.starts_with('+') => {
                Ok(FileMode(m))
            }
            _ => Err(format!(
                "Invalid mode '{s}': permission bits in octal, such as \"0660\" (at most 0777)"
            )),
        }
    }
}

impl Serialize for FileMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<FileMode, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FileMode;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("permission bits as an octal string, such as \"0660\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FileMode, E> {
                Err(E::custom(format!(
                    "mode {v}: write the permission bits as an octal string, such as \"0660\""
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FileMode, E> {
                self.visit_u64(v.unsigned_abs())
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FileMode, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_by_name_or_number_round_trip() {
        for (json, want) in [
            ("\"libvirt-qemu\"", Account::Name("libvirt-qemu".into())),
            ("64055", Account::Id(64055)),
            ("\"107\"", Account::Id(107)),
        ] {
            let a: Account = serde_json::from_str(json).unwrap();
            assert_eq!(a, want);
        }
        assert_eq!(
            serde_json::to_string(&Account::Name("kvm".into())).unwrap(),
            "\"kvm\""
        );
        assert_eq!(serde_json::to_string(&Account::Id(0)).unwrap(), "0");
        for bad in [
            "\"\"",
            "\"a b\"",
            "\"root:root\"",
            "-1",
            "4294967296",
            "true",
        ] {
            assert!(serde_json::from_str::<Account>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes_are_octal_strings() {
        for (s, want) in [("0660", 0o660), ("660", 0o660), ("0o600", 0o600), ("0", 0)] {
            assert_eq!(s.parse::<FileMode>().unwrap(), FileMode(want), "{s}");
        }
        assert_eq!(FileMode(0o660).to_string(), "0660");
        assert_eq!(serde_json::to_string(&FileMode(0o600)).unwrap(), "\"0600\"");
        for bad in ["", "0o", "888", "1777", "+660", "rw-rw----"] {
            assert!(bad.parse::<FileMode>().is_err(), "{bad}");
        }
        let e = serde_json::from_str::<FileMode>("660").unwrap_err();
        assert!(e.to_string().contains("octal string"), "{e}");
    }
}
