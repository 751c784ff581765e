//! The forwarder's method and path rules, tested on what git, gh, npm and a hostile agent send:
//! every route allowed and refused, and the tricks around them (case, `.git`, two services,
//! hidden and aliased mutations, batches, fragments, foreign packages).

use super::*;

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn github(part: GithubPart, read: &[&str], write: &[&str], mutations: &[&str]) -> Rules {
    let access = GithubAccess { read: strings(read), write: strings(write), mutations: strings(mutations) };
    Rules::Github { part, access }
}

/// github.com for a user who reads everything and writes octo/hello.
fn git() -> Rules {
    github(GithubPart::Git, &["*/*"], &["octo/hello"], &[])
}

fn api(mutations: &[&str]) -> Rules {
    github(GithubPart::Api, &["*/*"], &["octo/hello"], mutations)
}

fn npm(publish: &[&str]) -> Rules {
    Rules::Npm { publish: strings(publish) }
}

/// The head verdict on `METHOD target`, the query being what follows `?`.
fn head(rules: &Rules, method: &str, target: &str) -> Result<Verdict, Refused> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    rules.judge_head(&Request { method, path, query })
}

fn passes(rules: &Rules, method: &str, target: &str) {
    assert_eq!(head(rules, method, target), Ok(Verdict::Pass), "{method} {target}");
}

/// The refusal's line, checked to be one line with the given status.
fn refusal(result: Result<impl std::fmt::Debug, Refused>, status: u16) -> String {
    let refused = result.expect_err("refused");
    let (code, line) = (refused.status(), refused.reason().to_string());
    assert_eq!(code, status, "{line}");
    assert!(!line.contains(['\n', '\r']), "{line:?}");
    line
}

fn refused(rules: &Rules, method: &str, target: &str) -> String {
    refusal(head(rules, method, target), 403)
}

/// The verdict on a body, after the head asked for it.
fn body(rules: &Rules, method: &str, target: &str, body: &str) -> Result<(), Refused> {
    assert_eq!(head(rules, method, target), Ok(Verdict::Body), "{method} {target}");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    rules.judge_body(&Request { method, path, query }, body.as_bytes())
}

#[test]
fn the_config_travels_as_json() {
    let rules = vec![
        Rules::Any,
        github(GithubPart::Uploads, &["*/*"], &["octo/*"], &["createPullRequest"]),
        npm(&["@me/*"]),
        Rules::Http { allow: vec![HttpRule { methods: strings(&["GET"]), path: "/v1/**".into() }] },
    ];
    let json = serde_json::to_string(&rules).unwrap();
    assert!(json.contains(r#"{"kind":"github","part":"uploads","access":{"read":["*/*"]"#), "{json}");
    assert_eq!(serde_json::from_str::<Vec<Rules>>(&json).unwrap(), rules);
}

#[test]
fn git_fetches_what_it_may_read_and_pushes_what_it_may_write() {
    let rules = git();
    passes(&rules, "GET", "/octo/hello.git/info/refs?service=git-upload-pack");
    passes(&rules, "GET", "/octo/other/info/refs?service=git-upload-pack");
    passes(&rules, "POST", "/octo/other.git/git-upload-pack");
    passes(&rules, "GET", "/octo/hello.git/info/refs?service=git-receive-pack");
    passes(&rules, "POST", "/octo/hello.git/git-receive-pack");
    passes(&rules, "POST", "/octo/hello/git-receive-pack");
    // Dumb HTTP: no service is a read.
    passes(&rules, "GET", "/octo/other/info/refs");
    let line = refused(&rules, "POST", "/octo/secret.git/git-receive-pack");
    assert_eq!(
        line,
        "push to octo/secret is refused: octo/secret is not writable; `forward: {github: {write: [octo/secret]}}` in a policy allows it"
    );
    let line = refused(&rules, "GET", "/octo/secret.git/info/refs?service=git-receive-pack");
    assert!(line.starts_with("push to octo/secret is refused"), "{line}");
}

#[test]
fn git_reads_only_the_listed_repositories() {
    let rules = github(GithubPart::Git, &["octo/hello", "friends/*"], &[], &[]);
    passes(&rules, "GET", "/OCTO/Hello.GIT/info/refs?service=git-upload-pack");
    passes(&rules, "POST", "/friends/anything/git-upload-pack");
    let line = refused(&rules, "POST", "/octo/secret/git-upload-pack");
    assert!(line.contains("`forward: {github: {read: [octo/secret]}}`"), "{line}");
    refused(&rules, "GET", "/octo/secret/info/refs?service=git-upload-pack");
    refused(&rules, "GET", "/octo/secret/info/refs");
    // Nothing is writable.
    refused(&rules, "POST", "/octo/hello/git-receive-pack");
}

#[test]
fn a_push_to_an_unlisted_repository_is_refused_however_it_is_spelled() {
    let rules = git();
    for target in [
        "/OCTO/Secret/git-receive-pack",
        "/octo/secret.git/git-receive-pack",
        "/octo/secret.GIT/git-receive-pack",
        "/octo/secret/GIT-RECEIVE-PACK",
        "/octo/secret/git-receive-pack/",
        "/octo/hello.git.git/git-receive-pack",
    ] {
        refused(&rules, "POST", target);
    }
    // The same, announced by an upload-pack discovery first: the POST is judged on its own.
    passes(&rules, "GET", "/octo/secret/info/refs?service=git-upload-pack");
    refused(&rules, "POST", "/octo/secret/git-receive-pack");
    // A repository named `.git` alone names nothing.
    refused(&rules, "POST", "/octo/.git/git-receive-pack");
}

#[test]
fn an_info_refs_query_is_read_strictly() {
    let rules = git();
    let line =
        refused(&rules, "GET", "/octo/secret/info/refs?service=git-upload-pack&service=git-receive-pack");
    assert!(line.contains("two services"), "{line}");
    refused(&rules, "GET", "/octo/hello/info/refs?service=git-upload-pack;service=git-receive-pack");
    for query in ["Service=git-receive-pack", "serv%69ce=git-receive-pack", "service=git%2Dreceive-pack"] {
        refused(&rules, "GET", &format!("/octo/secret/info/refs?{query}"));
        passes(&rules, "GET", &format!("/octo/hello/info/refs?{query}"));
    }
    passes(&rules, "GET", "/octo/hello/info/refs?x=1&service=git-upload-pack&y");
    refused(&rules, "GET", "/octo/hello/info/refs?service=GIT-RECEIVE-PACK");
    refused(&rules, "GET", "/octo/hello/info/refs?service=git-upload-archive");
    refusal(head(&rules, "GET", "/octo/hello/info/refs?service=%zz"), 400);
    // The service is read from the query, never from the path.
    refused(&rules, "GET", "/octo/secret/info/refs?service=git-receive-pack&x=service=git-upload-pack");
}

#[test]
fn lfs_batches_are_judged_by_their_operation() {
    let rules = git();
    let batch = "/octo/hello.git/info/lfs/objects/batch";
    assert_eq!(body(&rules, "POST", batch, r#"{"operation":"upload","objects":[]}"#), Ok(()));
    assert_eq!(body(&rules, "POST", batch, r#"{"operation":"download","objects":[]}"#), Ok(()));
    let secret = "/octo/secret/info/lfs/objects/batch";
    assert_eq!(body(&rules, "POST", secret, r#"{"operation":"download"}"#), Ok(()));
    let line = refusal(body(&rules, "POST", secret, r#"{"operation":"upload"}"#), 403);
    assert!(line.starts_with("an LFS upload to octo/secret is refused"), "{line}");
    refusal(body(&rules, "POST", batch, r#"{"operation":"delete"}"#), 403);
    refusal(body(&rules, "POST", batch, "not json"), 400);
    refusal(body(&rules, "POST", batch, r#"{"objects":[]}"#), 400);
    refusal(body(&rules, "POST", batch, r#"{"operation":"download","operation":"upload"}"#), 400);
    refusal(body(&rules, "POST", batch, r#"{"operation":["upload"]}"#), 400);
    let reader = github(GithubPart::Git, &["octo/hello"], &[], &[]);
    refusal(body(&reader, "POST", "/octo/other/info/lfs/objects/batch", r#"{"operation":"download"}"#), 403);
}

#[test]
fn other_lfs_requests_read_or_write() {
    let rules = git();
    passes(&rules, "GET", "/octo/secret/info/lfs/locks");
    passes(&rules, "HEAD", "/octo/other.git/info/lfs/objects/abc");
    passes(&rules, "POST", "/octo/hello/info/lfs/locks/verify");
    let line = refused(&rules, "POST", "/octo/secret/info/lfs/locks");
    assert!(line.starts_with("an LFS `POST` to octo/secret is refused"), "{line}");
    refused(&rules, "DELETE", "/octo/secret/INFO/LFS/locks/1");
    let reader = github(GithubPart::Git, &["octo/hello"], &[], &[]);
    let line = refused(&reader, "GET", "/octo/secret/info/lfs/objects/abc");
    assert!(
        line.starts_with("an LFS `GET` to octo/secret is refused: octo/secret is not readable"),
        "{line}"
    );
}

#[test]
fn github_com_passes_other_reads_and_refuses_other_writes() {
    let rules = git();
    for target in ["/", "/login", "/octo/secret/releases/download/v1/x.tgz", "/octo/hello/pulls"] {
        passes(&rules, "GET", target);
        passes(&rules, "HEAD", target);
    }
    let line = refused(&rules, "POST", "/octo/hello/issues");
    assert!(line.contains("only git's own requests"), "{line}");
    refused(&rules, "POST", "/session");
    refused(&rules, "PUT", "/octo/hello/git-receive-pack");
    refused(&rules, "POST", "/octo/hello/info/refs?service=git-upload-pack");
    refused(&rules, "OPTIONS", "/");
}

#[test]
fn the_api_reads_by_repository() {
    let rules = github(GithubPart::Api, &["octo/hello"], &[], &[]);
    passes(&rules, "GET", "/repos/octo/hello");
    passes(&rules, "GET", "/repos/Octo/HELLO/contents/README.md");
    passes(&rules, "GET", "/user");
    passes(&rules, "GET", "/repos/octo");
    let line = refused(&rules, "GET", "/repos/octo/secret/contents/key");
    assert!(line.starts_with("reading octo/secret is refused"), "{line}");
    refused(&rules, "HEAD", "/REPOS/octo/secret");
    refused(&rules, "GET", "/Repos/octo/secret.git/issues");
    // A repository by number could be any: only a policy that reads all lets it through.
    refused(&rules, "GET", "/repositories/1234/contents/key");
    passes(&api(&[]), "GET", "/repositories/1234/contents/key");
}

#[test]
fn the_api_writes_into_writable_repositories() {
    let rules = api(&[]);
    passes(&rules, "POST", "/repos/octo/hello/issues");
    passes(&rules, "PATCH", "/repos/octo/hello/pulls/1");
    passes(&rules, "PUT", "/repos/Octo/Hello/contents/a.txt");
    passes(&rules, "DELETE", "/repos/octo/hello/git/refs/heads/topic");
    passes(&rules, "POST", "/repos/octo/hello/branches/main/rename");
    let line = refused(&rules, "POST", "/repos/octo/secret/issues");
    assert_eq!(
        line,
        "`POST /repos/octo/secret/issues` is refused: octo/secret is not writable; `forward: {github: {write: [octo/secret]}}` in a policy allows it"
    );
    // `.git`, or `/Repos` in another case, is the same repository, judged as a write.
    passes(&rules, "POST", "/repos/octo/hello.git/issues");
    refused(&rules, "POST", "/repos/octo/secret.git/issues");
    refused(&rules, "POST", "/Repos/octo/secret/issues");
    refused(&rules, "POST", "/REPOS/OCTO/SECRET/issues");
}

#[test]
fn the_api_never_writes_what_copies_opens_or_runs_a_repository() {
    let rules = api(&[]);
    for sub in [
        "transfer",
        "forks",
        "generate",
        "collaborators/evil",
        "invitations/1",
        "hooks",
        "keys",
        "actions/secrets/X",
        "environments/prod",
        "pages",
        "rulesets",
        "secret-scanning/alerts/1",
        "dependabot/secrets/X",
        "codespaces",
        "dispatches",
        "FORKS",
        "branches/main/protection",
    ] {
        let line = refused(&rules, "POST", &format!("/repos/octo/hello/{sub}"));
        assert!(line.ends_with("which no policy allows"), "{line}");
    }
    assert!(refused(&rules, "POST", "/repos/octo/hello/forks").contains("copy the repository elsewhere"));
    assert!(refused(&rules, "PUT", "/repos/octo/hello/collaborators/x").contains("who can read"));
    assert!(refused(&rules, "PUT", "/repos/octo/hello/actions/secrets/X").contains("secrets"));
    let line = refused(&rules, "PATCH", "/repos/octo/hello");
    assert!(line.contains("could make it public"), "{line}");
    refused(&rules, "DELETE", "/repos/octo/hello");
    refused(&rules, "DELETE", "/repos/octo/hello.git/");
}

#[test]
fn the_api_refuses_writes_outside_repositories() {
    let rules = api(&[]);
    let line = refused(&rules, "POST", "/gists");
    assert!(line.contains("a gist is readable by anyone with its link"), "{line}");
    refused(&rules, "PATCH", "/Gists/abc");
    for (method, target) in [
        ("POST", "/user/repos"),
        ("PATCH", "/user"),
        ("POST", "/orgs/octo/repos"),
        ("PUT", "/user/starred/octo/hello"),
        ("POST", "/repositories/1/issues"),
        ("POST", "/repos/octo"),
        ("POST", "/markdown"),
    ] {
        let line = refused(&rules, method, target);
        assert!(line.contains("writes only under /repos/OWNER/REPO/"), "{line}");
    }
}

#[test]
fn graphql_goes_by_post_alone_and_is_read_whole() {
    let rules = api(&[]);
    let line = refused(&rules, "GET", "/graphql?query=mutation{createGist}");
    assert!(line.contains("by POST alone"), "{line}");
    refused(&rules, "GET", "/GraphQL/");
    refused(&rules, "HEAD", "/graphql");
    refused(&rules, "PUT", "/graphql");
    refused(&rules, "POST", "/graphql?query=mutation{createGist}");
    assert_eq!(head(&rules, "POST", "/GRAPHQL"), Ok(Verdict::Body));
    assert_eq!(body(&rules, "POST", "/graphql", r#"{"query":"query{viewer{login}}"}"#), Ok(()));
    assert_eq!(body(&rules, "POST", "/graphql", r#"{"query":"{viewer{login}}","variables":{}}"#), Ok(()));
    let named = r#"{"query":"query Q($n:Int){viewer{repositories(first:$n){nodes{name}}}}","operationName":"Q","variables":{"n":3}}"#;
    assert_eq!(body(&rules, "POST", "/graphql", named), Ok(()));
}

/// The verdict on a GraphQL body sent to api.github.com with `mutations` allowed.
fn graphql_body(mutations: &[&str], json: &str) -> Result<(), Refused> {
    body(&api(mutations), "POST", "/graphql", json)
}

fn one(query: &str) -> String {
    serde_json::json!({ "query": query }).to_string()
}

#[test]
fn mutations_pass_only_when_listed() {
    let allowed = &["createPullRequest", "addComment"];
    assert_eq!(
        graphql_body(allowed, &one("mutation{createPullRequest(input:{}){clientMutationId}}")),
        Ok(())
    );
    let two = "mutation M { a: createPullRequest(input:{}){x} addComment(input:{}){x} }";
    assert_eq!(graphql_body(allowed, &one(two)), Ok(()));
    let line =
        refusal(graphql_body(allowed, &one(r#"mutation{createGist(input:{files:[]}){gist{url}}}"#)), 403);
    assert_eq!(
        line,
        "the GraphQL mutation createGist is refused: it is not an allowed mutation; `forward: {github: {mutations: [createGist]}}` in a policy allows it"
    );
    refusal(graphql_body(&[], &one("mutation{createPullRequest}")), 403);
    refusal(graphql_body(allowed, &one("mutation{createPullRequest{x} createGist{x}}")), 403);
    // Names are compared exactly, as GraphQL does.
    refusal(graphql_body(allowed, &one("mutation{CreatePullRequest}")), 403);
}

#[test]
fn a_hidden_mutation_is_found() {
    let allowed = &["ok"];
    // After a query in the same document.
    refusal(graphql_body(allowed, &one("query{a} mutation{createGist}")), 403);
    refusal(graphql_body(allowed, &one("query A{a}\nmutation B{deleteRepository(input:{}){x}}")), 403);
    // In a later document of a batch.
    let batch = r#"[{"query":"query{a}"},{"query":"mutation{createIssue}"}]"#;
    refusal(graphql_body(allowed, batch), 403);
    // Under an alias that names an allowed mutation.
    refusal(graphql_body(allowed, &one("mutation{ok: createGist}")), 403);
    // Behind a comment that ends at a carriage return.
    refusal(graphql_body(allowed, &one("query{a} #x\rmutation{createGist}")), 403);
    // Behind commas and a byte-order mark.
    refusal(graphql_body(allowed, &one("\u{feff},,mutation,{createGist}")), 403);
    // A fragment at the top of a mutation, spread or inline, even one made of allowed fields.
    let spread = "mutation{...F} fragment F on Mutation{ok}";
    let line = refusal(graphql_body(allowed, &one(spread)), 403);
    assert!(line.contains("fragment"), "{line}");
    refusal(graphql_body(allowed, &one("mutation{... on Mutation{createGist}}")), 403);
    // A fragment used by a query is a query's business.
    assert_eq!(graphql_body(&[], &one("query{viewer{...F}} fragment F on User{login}")), Ok(()));
    // In a string it is only text.
    assert_eq!(graphql_body(&[], &one(r#"query{search(query:"mutation{createGist}"){x}}"#)), Ok(()));
    assert_eq!(graphql_body(&[], &one(r#"query{search(query:"""a \""" mutation{b}"""){x}}"#)), Ok(()));
}

#[test]
fn subscriptions_are_refused() {
    let line = refusal(graphql_body(&["x"], &one("subscription{x}")), 403);
    assert!(line.contains("subscription"), "{line}");
    refusal(graphql_body(&["x"], &one("query{a} subscription S{x}")), 403);
}

#[test]
fn a_body_that_is_not_a_graphql_request_is_refused() {
    for json in [
        "not json",
        "",
        "[]",
        r#"{"query":1}"#,
        r#"{"query":null}"#,
        r#"{"query":["mutation{x}"]}"#,
        r#"{"variables":{}}"#,
        r#"{"query":"query{a}","query":"mutation{createGist}"}"#,
        r#"{"query":"query{a}","doc_id":"123"}"#,
        r#"{"query":"query{a}"} {"query":"mutation{x}"}"#,
        r#"[{"query":"query{a}"},1]"#,
        "\u{feff}{\"query\":\"query{a}\"}",
    ] {
        let refused = graphql_body(&[], json).expect_err(json);
        let (status, line) = (refused.status(), refused.reason());
        assert_eq!(status, 400, "{json}: {line}");
        assert!(line.starts_with("a GraphQL request is refused"), "{line}");
    }
    for query in ["garbage", "mutation{", "query{a}}", "{a b: }", "type Q{a:Int}", "{a(x:\"\n\")}", "{a.b}"] {
        let line = refusal(graphql_body(&[], &one(query)), 400);
        assert!(line.contains("does not parse"), "{line}");
    }
    // Nesting past the parser's limit is refused, not a stack overflow.
    let deep = format!("query{}{}", "{a".repeat(5000), "}".repeat(5000));
    refusal(graphql_body(&[], &one(&deep)), 400);
}

#[test]
fn release_uploads_go_into_writable_repositories() {
    let rules = github(GithubPart::Uploads, &["*/*"], &["octo/hello"], &[]);
    passes(&rules, "POST", "/repos/octo/hello/releases/1/assets?name=a.tgz");
    passes(&rules, "POST", "/REPOS/Octo/Hello.git/Releases/1/Assets");
    passes(&rules, "GET", "/anything");
    let line = refused(&rules, "POST", "/repos/octo/secret/releases/1/assets?name=a.tgz");
    assert!(line.starts_with("a release upload to octo/secret is refused"), "{line}");
    let line = refused(&rules, "PUT", "/repos/octo/hello/releases/1/assets");
    assert!(line.contains("only release assets"), "{line}");
    refused(&rules, "POST", "/repos/octo/hello/releases/1");
    refused(&rules, "POST", "/repos/octo/hello/releases/1/assets/x");
}

#[test]
fn npm_reads_and_audits_pass() {
    let rules = npm(&[]);
    for target in
        ["/left-pad", "/@scope/name", "/-/v1/search?text=x", "/-/whoami", "/left-pad/-/left-pad-1.0.0.tgz"]
    {
        passes(&rules, "GET", target);
        passes(&rules, "HEAD", target);
    }
    passes(&rules, "POST", "/-/npm/v1/security/advisories/bulk");
    passes(&rules, "POST", "/-/npm/v1/security/audits/quick");
    for target in
        ["/-/npm/v1/security/audits", "/-/npm/v1/security/audits/quick/x", "/-/NPM/v1/security/audits/quick"]
    {
        refused(&rules, "POST", target);
    }
    refused(&rules, "PUT", "/-/npm/v1/security/advisories/bulk");
}

#[test]
fn npm_publishes_only_listed_packages() {
    let rules = npm(&["mine", "@me/*", "@team/tool"]);
    for (method, target) in [
        ("PUT", "/mine"),
        ("PUT", "/mine/"),
        ("PUT", "/@me/anything"),
        ("PUT", "/@team/tool"),
        ("PUT", "/mine/-rev/3-abc"),
        ("DELETE", "/mine/-rev/3-abc"),
        ("DELETE", "/@me/x/-/x-1.0.0.tgz/-rev/4-def"),
        ("PUT", "/-/package/mine/dist-tags/latest"),
        ("DELETE", "/-/package/@me/x/dist-tags/beta"),
    ] {
        passes(&rules, method, target);
    }
    let line = refused(&rules, "PUT", "/evil");
    assert_eq!(
        line,
        "publishing evil is refused: evil is not a package the agent may publish; `forward: {npm: {publish: [evil]}}` in a policy allows it"
    );
    for (method, target) in [
        ("PUT", "/Mine"),
        ("PUT", "/@team/other"),
        ("PUT", "/@me"),
        ("PUT", "/@mine/x"),
        ("PUT", "/other/-rev/1-a"),
        ("DELETE", "/other/-rev/1-a"),
        ("DELETE", "/@x/y/-/y-1.0.0.tgz/-rev/1-a"),
        ("PUT", "/-/package/other/dist-tags/latest"),
        ("DELETE", "/-/package/@team/other/dist-tags/latest"),
    ] {
        refused(&rules, method, target);
    }
    assert!(refused(&rules, "DELETE", "/other/-rev/1-a").starts_with("unpublishing other"));
    assert!(
        refused(&rules, "PUT", "/-/package/other/dist-tags/x").starts_with("changing a dist-tag of other")
    );
}

#[test]
fn npm_refuses_other_writes_even_of_listed_packages() {
    let rules = npm(&["mine"]);
    for (method, target) in [
        ("POST", "/mine"),
        ("PATCH", "/mine"),
        ("DELETE", "/mine"),
        ("PUT", "/mine/1.0.0"),
        ("POST", "/-/package/mine/access"),
        ("POST", "/-/package/mine/dist-tags/latest"),
        ("PUT", "/-/package/mine/dist-tags"),
        ("PUT", "/-/anything"),
        ("POST", "/-/v1/search"),
    ] {
        let line = refused(&rules, method, target);
        assert!(line.contains("the agent only reads, audits"), "{line}");
    }
}

#[test]
fn npm_logins_tokens_orgs_and_teams_are_never_forwarded() {
    let rules = npm(&["*", "mine"]);
    for (method, target) in [
        ("PUT", "/-/user/org.couchdb.user:me"),
        ("POST", "/-/v1/login"),
        ("POST", "/-/npm/v1/tokens"),
        ("DELETE", "/-/npm/v1/tokens/token/abc"),
        ("PUT", "/-/org/acme/user"),
        ("PUT", "/-/team/acme/devs/user"),
    ] {
        let line = refused(&rules, method, target);
        assert!(line.contains("run `npm login` on the host"), "{line}");
    }
}

fn http(rules: &[(&[&str], &str)]) -> Rules {
    let allow = rules.iter().map(|(m, p)| HttpRule { methods: strings(m), path: p.to_string() }).collect();
    Rules::Http { allow }
}

#[test]
fn a_declared_api_allows_what_its_rules_match() {
    let rules = http(&[
        (&["GET"], "/v1/items/*"),
        (&["POST", "PUT"], "/v1/items/*/notes"),
        (&["*"], "/v2/**"),
        (&["GET"], "/docs/**/index.html"),
    ]);
    passes(&rules, "GET", "/v1/items/42");
    passes(&rules, "POST", "/v1/items/42/notes");
    passes(&rules, "PUT", "/v1/items/42/notes");
    passes(&rules, "DELETE", "/v2/anything/at/all");
    passes(&rules, "PATCH", "/v2");
    passes(&rules, "GET", "/docs/index.html");
    passes(&rules, "GET", "/docs/a/b/index.html");
    for (method, target) in [
        ("DELETE", "/v1/items/42"),
        ("HEAD", "/v1/items/42"),
        ("GET", "/v1/items"),
        ("GET", "/v1/items/"),
        ("GET", "/v1/items/42/notes"),
        ("GET", "/V1/items/42"),
        ("DELETE", "/v1/items/42/notes"),
        ("GET", "/v3"),
        ("GET", "/docs/a/index.htm"),
    ] {
        refused(&rules, method, target);
    }
    let line = refused(&rules, "DELETE", "/v1/items/42");
    assert_eq!(
        line,
        "`DELETE /v1/items/42` is refused: none of the service's `allow` rules matches it; a rule such as `{methods: [DELETE], path: /v1/items/42}` in the service's `allow` in a policy's `forward` allows it"
    );
    refused(&http(&[]), "GET", "/");
}

#[test]
fn globs_match_by_whole_segments() {
    assert!(glob("/", "/"));
    assert!(glob("/**", "/"));
    assert!(glob("/**", "/a/b/c"));
    assert!(glob("/a/**/b/**/c", "/a/b/c"));
    assert!(glob("/a/**/b/**/c", "/a/x/b/y/z/c"));
    assert!(!glob("/a/**/b/**/c", "/a/x/y/c"));
    assert!(glob("/a/*/c", "/a/b/c"));
    assert!(!glob("/a/*/c", "/a/b/x/c"));
    assert!(!glob("/a/*", "/a/"));
    assert!(!glob("/a/b*", "/a/bc"));
    assert!(glob("/a/b*", "/a/b*"));
    assert!(!glob("/a", "/a/b"));
    // An adversarial path against many `**` stays quick.
    let long = format!("/{}", vec!["a"; 4000].join("/"));
    assert!(!glob("/**/a/**/a/**/a/**/a/**/b", &long));
}

#[test]
fn any_passes_everything_and_bodies_of_passed_requests_are_not_read() {
    passes(&Rules::Any, "DELETE", "/anything");
    let req = Request { method: "GET", path: "/graphql", query: "" };
    assert!(api(&[]).judge_body(&req, b"mutation{x}").is_err());
    let req = Request { method: "GET", path: "/repos/octo/hello", query: "" };
    assert_eq!(api(&[]).judge_body(&req, b"anything"), Ok(()));
    let req = Request { method: "PUT", path: "/x", query: "" };
    assert!(npm(&[]).judge_body(&req, b"").is_err());
}

#[test]
fn a_refusal_never_spans_lines() {
    let rules = http(&[]);
    let line = refused(&rules, "GET", "/a\nb\rc\u{1b}]52;\u{9b}");
    assert!(line.contains("/a?b?c?]52;?"), "{line}");
}

/// The red team's second round: writes that run code with the repository's secrets, an LFS
/// operation in another case, the npm token list read.
#[test]
fn writes_that_would_run_code_and_account_reads_are_refused() {
    let api = api(&[]);
    for target in [
        "/repos/octo/hello/contents/.github/workflows/x.yml",
        "/repos/octo/hello/contents/.GitHub/Workflows/x.yml",
        "/repos/octo/hello/deployments",
        "/repos/octo/hello/check-suites/1/rerequest",
        "/repos/octo/hello/check-runs/7/rerequest",
    ] {
        let line = refused(&api, "PUT", target);
        assert!(line.contains("run code"), "{target}: {line}");
    }
    assert_eq!(head(&api, "PUT", "/repos/octo/hello/contents/src/main.rs"), Ok(Verdict::Pass));
    let lfs = "/octo/secret.git/info/lfs/objects/batch";
    let read_only = github(GithubPart::Git, &["*/*"], &[], &[]);
    assert!(body(&read_only, "POST", lfs, r#"{"operation":"download","OPERATION":"upload"}"#).is_err());
    assert!(body(&read_only, "POST", lfs, r#"{"operation":"download"}"#).is_ok());
    refused(&npm(&[]), "GET", "/-/npm/v1/tokens");
    passes(&npm(&[]), "GET", "/left-pad");
}
