//! `--token-auth-file`: static bearer tokens, one per CSV line `token,user,uid,"g1,g2"` (the
//! groups column is optional), as kube-apiserver reads it.

use std::collections::HashMap;
use std::path::Path;

use super::{TokenAuthenticator, UserInfo};

/// The tokens of a static token file.
#[derive(Debug, Default)]
pub struct TokenFile {
    users: HashMap<String, UserInfo>,
}

impl TokenFile {
    /// Reads the file; an error names the file and the line that is wrong.
    pub fn load(path: &Path) -> Result<TokenFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        TokenFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<TokenFile, String> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = csv_fields(line);
            if fields.len() < 3 {
                return Err(format!(
                    "token file is invalid, line {}: expected at least 3 columns, got {}",
                    i + 1,
                    fields.len()
                ));
            }
            let groups = fields
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let mut user = UserInfo::authenticated(fields[1].clone(), groups);
            user.uid = fields[2].clone();
            if users.insert(fields[0].clone(), user).is_some() {
                tracing::warn!(line = i + 1, "duplicate token in the token file");
            }
        }
        Ok(TokenFile { users })
    }
}

impl TokenAuthenticator for TokenFile {
    fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
        Ok(self.users.get(token).cloned())
    }
}

/// The fields of one CSV line: commas separate, double quotes group (with `""` a quote).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().expect("one field").push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields.into_iter().map(|f| f.trim().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_token_user_uid_and_groups() {
        let f = TokenFile::parse("# tokens\nt1,alice,1,\"dev,ops\"\nt2,bob,2\n").unwrap();
        let alice = f.authenticate("t1").unwrap().unwrap();
        assert_eq!(alice.username, "alice");
        assert_eq!(alice.uid, "1");
        assert_eq!(alice.groups, vec!["dev", "ops", "system:authenticated"]);
        assert_eq!(
            f.authenticate("t2").unwrap().unwrap().groups,
            vec!["system:authenticated"]
        );
        assert_eq!(f.authenticate("t3").unwrap(), None);
        assert!(TokenFile::parse("only,two\n").is_err());
    }
}
